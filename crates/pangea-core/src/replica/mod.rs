//! The replica state machine: scoped streams, tree forwarding, gap repair, exact
//! watermarks, heartbeats, snapshots and failure suspicion — with no I/O.
//!
//! Shaped like quinn-proto: inputs are `handle_*(now, …)` and [`Replica::propose`];
//! outputs are pulled with [`Replica::poll_transmit`], [`Replica::poll_timeout`] and
//! [`Replica::poll_event`]. Storage goes through [`Storage`]; time arrives as
//! [`Now`]; randomness comes from a seeded generator. The QUIC node and the simulator
//! drive this same code.
//!
//! Here: the types, the constructor, what callers read, the entry points
//! (`handle_*`, `poll_*`) and suspicion; by concern, in submodules: `write` (local
//! writes and the flush), `apply` (applying and forwarding streams), `repair` (gap
//! repair), `snapshot`, `heartbeat` and `compaction`.
//!
//! ## Driving it
//! 1. Feed inputs: frames from peers (`handle_frame`), timer expiry
//!    (`handle_timeout`), local writes (`propose`), view changes (`handle_view`).
//! 2. Call [`Replica::flush`]: one `Storage::sync` for everything since the last
//!    flush (group commit). Only then are local writes acknowledged
//!    ([`Event::Committed`]) and sent, and watermarks advertised (I2, I6).
//! 3. Drain `poll_transmit` (tell [`Replica::handle_sent`] when a frame has left or
//!    was dropped, to release its in-flight bytes), `poll_event`, and arm a timer for
//!    `poll_timeout`.
//!
//! ## Streams
//! Every write belongs to a scope (the row's placement policy) and gets the next
//! sequence of its (scope, origin) stream. Receivers apply each stream strictly in
//! order, drop duplicates, buffer out-of-order entries (at most `reorder_window`
//! ahead) and ask neighbours for missing ranges; a replica whose gap is older than a
//! neighbour's retained log gets a snapshot. Each entry is forwarded along the
//! scope's tree to every neighbour but the one it came from. The tree only decides
//! who forwards to whom; sequences, duplicate drop and gap repair make any tree, or
//! none, converge (principle 2, I8).

use crate::frame::{
    Applied, Frame, FrameClass, FrameLimits, GapFill, GapRequest, Heartbeat, SnapshotChunk,
};
use crate::hlc::{ClockError, HybridClock, Timestamp};
use crate::idmap::{IdMap, Roster};
use crate::ids::{ReplicaId, ScopeId};
use crate::limits::{Limited, Limits};
use crate::location::{InvalidEntry, JOBS_TABLE, LOCATION_TABLE, Location, LocationChange};
use crate::mutation::{Mutation, RowMutation};
use crate::row::{RowState, Version};
use crate::storage::{Compaction, LogEntry, RowApply, RowWrite, Storage, Watermark, WriteBatch};
use crate::token::Token;
use crate::watermark::ScopeWatermarks;
use crate::{Error, StorageError};
use bytes::Bytes;
use pangea_proto::v1 as pb;
use pangea_topology::{Deployment, RegionId, Role, Tree};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

mod apply;
mod compaction;
mod heartbeat;
mod repair;
mod snapshot;
mod write;

/// Time as the driver sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Monotonic microseconds (timers). Never goes backwards.
    pub mono_us: u64,
    /// Wall-clock Unix milliseconds (the HLC's physical time). May jump.
    pub wall_ms: u64,
}

/// Tuning of a replica. Every bound is named and documented.
#[derive(Debug, Clone)]
pub struct Config {
    /// Each replica sends its heartbeat this often (default 50 ms).
    pub heartbeat_interval_ms: u64,
    /// Heartbeats learned from others are forwarded after at most this long,
    /// coalesced into one frame per neighbour (default 5 ms).
    pub heartbeat_forward_delay_ms: u64,
    /// Every n-th heartbeat carries the replica's applied watermarks, from which
    /// everyone computes the purge horizon (default 10: twice a second).
    pub applied_gossip_every: u64,
    /// A member silent this long is suspected and routed around (default 1 s).
    pub suspect_after_ms: u64,
    /// Suspected members are probed with a direct heartbeat this often (default 1 s).
    pub probe_interval_ms: u64,
    /// Out-of-order entries more than this many sequences ahead of the applied
    /// watermark are refused (default 4,096 per stream); gap repair fetches them later.
    pub reorder_window: u64,
    /// A gap request unanswered this long (or two round trips to the peer asked,
    /// if longer) is retried with another peer (default 200 ms); the wait doubles
    /// with each request in a row left unanswered, up to 8x.
    pub gap_retry_ms: u64,
    /// How long a stream may look behind before a gap request goes out (default
    /// 100 ms): entries still in flight on another path, or queued behind a
    /// heartbeat, usually arrive within it.
    pub gap_grace_ms: u64,
    /// Most entries asked for, or sent, in one gap request (default 512).
    pub gap_entries_max: usize,
    /// Most bytes of entries sent in one answer to a gap request (default 8 MiB;
    /// a single larger entry still goes whole). The requester asks again for the
    /// rest. Without it, 512 entries of 100 KiB made a 51 MB frame, past what a
    /// peer reads (`pangea_net::FRAME_BYTES_MAX`, 17 MiB): the peer dropped the
    /// stream, the link reconnected, the same gap was asked again, and the stream
    /// never caught up.
    pub gap_fill_bytes_max: usize,
    /// Log entries kept per stream even when someone still needs them; a replica
    /// further behind gets a snapshot (default 1,000,000).
    pub log_entries_retained_max: u64,
    /// Target size of one snapshot chunk (default 1 MiB; a single larger row still
    /// goes whole).
    pub snapshot_chunk_bytes_max: usize,
    /// Bytes handed to the driver for one peer and not yet reported sent (default
    /// 8 MiB). Beyond it, frames wait in the replica.
    pub inflight_bytes_max: usize,
    /// Bytes of mutations waiting for one peer beyond which new ones are dropped
    /// and left to gap repair (default 32 MiB), so a slow peer cannot exhaust memory.
    pub queued_bytes_max: usize,
    /// Small mutations to one peer are coalesced into frames of at most this size
    /// (default 256 KiB).
    pub batch_bytes_max: usize,
    /// Remote timestamps further ahead than this are refused (default 500 ms).
    pub max_offset_ms: u64,
    /// How often the purge horizon is recomputed and logs truncated (default 1 s).
    pub compaction_interval_ms: u64,
    pub limits: Limits,
    pub frame_limits: FrameLimits,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            heartbeat_interval_ms: 50,
            heartbeat_forward_delay_ms: 5,
            applied_gossip_every: 10,
            suspect_after_ms: 1_000,
            probe_interval_ms: 1_000,
            reorder_window: 4_096,
            gap_retry_ms: 200,
            gap_grace_ms: 100,
            gap_entries_max: 512,
            gap_fill_bytes_max: 8 << 20,
            log_entries_retained_max: 1_000_000,
            snapshot_chunk_bytes_max: 1 << 20,
            inflight_bytes_max: 8 << 20,
            queued_bytes_max: 32 << 20,
            batch_bytes_max: 256 << 10,
            max_offset_ms: crate::hlc::MAX_OFFSET_MS_DEFAULT,
            compaction_interval_ms: 1_000,
            limits: Limits::default(),
            frame_limits: FrameLimits::default(),
        }
    }
}

/// A frame for the driver to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub to: ReplicaId,
    pub frame: Frame,
    pub class: FrameClass,
    /// Encoded size, counted against the peer's in-flight bound until
    /// [`Replica::handle_sent`].
    pub bytes: usize,
}

/// Why a frame (or part of one) from a peer was refused. Counted per reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reject {
    /// From a replica not in the topology.
    UnknownPeer,
    /// A scope this replica does not belong to (or that does not exist).
    UnknownScope,
    /// A sender or origin outside the scope's policy (residency).
    NotInScope,
    /// A sequence more than `reorder_window` ahead of the applied watermark.
    SequenceTooFarAhead,
    /// A timestamp more than `max_offset` ahead of local time (I1).
    TimestampAhead,
    /// An entry claiming to be this replica's own write, beyond what it wrote.
    ForeignOwnSequence,
    /// Not parseable or out of bounds (see `Frame::from_proto`).
    Malformed,
}

impl Reject {
    pub fn as_str(self) -> &'static str {
        match self {
            Reject::UnknownPeer => "unknown_peer",
            Reject::UnknownScope => "unknown_scope",
            Reject::NotInScope => "not_in_scope",
            Reject::SequenceTooFarAhead => "sequence_too_far_ahead",
            Reject::TimestampAhead => "timestamp_ahead",
            Reject::ForeignOwnSequence => "foreign_own_sequence",
            Reject::Malformed => "malformed",
        }
    }
}

/// What happened, for drivers, metrics and checkers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An entry was applied (in stream order).
    Applied {
        scope: ScopeId,
        origin: ReplicaId,
        sequence: u64,
        /// The entry's timestamp at its origin: the apply lag is the applying
        /// replica's clock minus this (drivers measure it; the core reads no clock).
        timestamp: Timestamp,
    },
    /// A durable watermark advanced (after a flush).
    WatermarkAdvanced {
        scope: ScopeId,
        origin: ReplicaId,
        watermark: Watermark,
    },
    /// A local write is durable and on its way: acknowledge it.
    Committed(Token),
    GapDetected {
        scope: ScopeId,
        origin: ReplicaId,
        from: u64,
        to: u64,
    },
    PeerSuspected(ReplicaId),
    PeerRecovered(ReplicaId),
    TreeChanged {
        scope: ScopeId,
        edges: usize,
    },
    /// This replica is too far behind a neighbour's log: it asked `from` for a snapshot.
    SnapshotNeeded {
        scope: ScopeId,
        from: ReplicaId,
    },
    SnapshotInstalled {
        scope: ScopeId,
        rows: u64,
    },
    /// A replica relearning its own streams ([`Replica::relearn_own_streams`]) now
    /// holds its own stream of `scope` as far as its peers had it, and writes there.
    OwnStreamLearned {
        scope: ScopeId,
        sequence: u64,
    },
    Rejected {
        from: ReplicaId,
        reason: Reject,
    },
    /// A `_location` row holds an entry that is not valid under the deployment
    /// (unknown table or policy, a home region outside its policy...): it is not in
    /// force, and its rows stay where the placement file puts them.
    LocationRefused(InvalidEntry),
    /// A location entry puts rows this replica holds under a policy that excludes
    /// it, but it is not the flip of a migration job that finished its backfill: the
    /// rows are kept (no purge on say-so, I10); the residency audit reports them.
    PurgeWithheld {
        table: Arc<str>,
        /// The entry's key prefix (user data: log it hashed).
        prefix: Bytes,
        policy: ScopeId,
    },
}

/// The `job_id` of a [`Purged`] that a resize, not a migration, caused: the
/// rows of shard groups this process no longer hosts.
pub const RESIZE_PURGE: &str = "resize";

/// Rows [`Replica::purge_moved_rows`] deleted after one migration's flip, or
/// after a resize moved shard groups away ([`RESIZE_PURGE`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Purged {
    pub table: Arc<str>,
    /// The flipped prefix (user data: log it hashed).
    pub prefix: Bytes,
    /// The migration job whose flip moved the rows away.
    pub job_id: String,
    pub rows: u64,
}

/// Counters for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Frames accepted from known peers.
    pub frames_received: u64,
    pub applied: u64,
    pub duplicates: u64,
    pub buffered: u64,
    pub gap_requests: u64,
    pub snapshots_sent: u64,
    pub snapshots_installed: u64,
    /// Rows larger than a snapshot chunk sent in parts (`RowState::split`).
    pub snapshot_rows_split: u64,
    pub dropped_queue_full: u64,
    pub rejected: BTreeMap<Reject, u64>,
}

/// One stream's catch-up progress ([`Replica::stream_progress`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamProgress<'a> {
    pub scope: &'a ScopeId,
    pub origin: &'a ReplicaId,
    /// Applied and durable here, with no gap below.
    pub durable: u64,
    /// The highest sequence known to exist.
    pub known_last: u64,
}

/// One origin's stream in one scope, as this replica has applied it.
#[derive(Debug, Clone, Default)]
struct Stream {
    /// Applied in order (maybe not yet durable).
    applied: Watermark,
    /// As of the last flush: what reads, tokens and gossip see.
    durable: Watermark,
    /// Whether `applied` has a timestamp advance not yet written to storage.
    dirty: bool,
    /// Whether the stream is listed in [`Replica::moved`].
    listed: bool,
    /// Out-of-order entries, with the peer each came from.
    pending: BTreeMap<u64, (LogEntry, ReplicaId)>,
    /// The highest sequence known to exist.
    known_last: u64,
    /// The newest heartbeat seen from the origin: (sequence, timestamp).
    heartbeat: (u64, Timestamp),
    /// A peer likely to have what we miss (it sent us something later).
    hint: Option<ReplicaId>,
    /// Since when the stream has looked behind (`known_last > applied`).
    behind_since_us: Option<u64>,
    gap: Option<GapInFlight>,
}

#[derive(Debug, Clone)]
struct GapInFlight {
    asked: ReplicaId,
    at_us: u64,
    attempt: u32,
    /// Requests in a row that got no answer before their wait ran out: each
    /// doubles the next wait (up to 8x). An answer may simply be slow — a gap
    /// fill of several MiB over a thin or distant link takes longer than two
    /// round trips — and asking again at a fixed pace fills the link with copies
    /// of the same answer, so the stream falls further behind the faster it asks.
    unanswered: u32,
}

/// What one member reported as applied in a scope: a watermark per origin, in
/// origin order. A sorted vector, not a map: a report is read and raised whole, by a
/// walk, with every heartbeat that gossips one.
#[derive(Debug, Clone, Default)]
struct Report(Vec<(ReplicaId, Watermark)>);

impl Report {
    /// From watermarks in strictly increasing origin order (our own, as
    /// `ScopeState::durable_watermarks` yields them).
    fn from_sorted(watermarks: Vec<(ReplicaId, Watermark)>) -> Report {
        debug_assert!(watermarks.windows(2).all(|w| w[0].0 < w[1].0));
        Report(watermarks)
    }

    fn get(&self, origin: &ReplicaId) -> Option<&Watermark> {
        let i = self.0.binary_search_by(|(o, _)| o.cmp(origin)).ok()?;
        Some(&self.0[i].1)
    }

    /// Takes each of `news`'s watermarks where it is later than the one held
    /// (sequence, then timestamp); an origin not held yet is added. `news` comes
    /// from a peer, so it may be in any order, with repeats: each is taken in turn.
    fn raise(&mut self, news: &[(ReplicaId, Watermark)]) {
        // A member gossips its report in origin order: then one walk of both does,
        // where a search per origin would walk ours once per origin.
        if news.windows(2).all(|w| w[0].0 < w[1].0) {
            let mut i = 0;
            for (origin, w) in news {
                while i < self.0.len() && self.0[i].0 < *origin {
                    i += 1;
                }
                if i < self.0.len() && self.0[i].0 == *origin {
                    self.0[i].1 = self.0[i].1.max(*w);
                } else {
                    self.0.insert(i, (origin.clone(), *w));
                }
                i += 1;
            }
            return;
        }
        for (origin, w) in news {
            match self.0.binary_search_by(|(o, _)| o.cmp(origin)) {
                Ok(i) => {
                    let cur = &mut self.0[i].1;
                    *cur = (*cur).max(*w);
                }
                Err(i) => self.0.insert(i, (origin.clone(), *w)),
            }
        }
    }
}

#[derive(Debug, Clone)]
struct ScopeState {
    /// Shared by every shard group of the scope's policy.
    members: Arc<Roster>,
    /// Members that store rows and write: the origins (shared like `members`).
    origins: Arc<Roster>,
    /// The same origins in one shared slice, which every watermark snapshot of
    /// the scope (one per read answered) holds instead of a copy of each id.
    origin_ids: Arc<[ReplicaId]>,
    /// The durable watermark of each of `origin_ids`, kept as streams' durable
    /// watermarks move ([`ScopeState::set_durable`]): a snapshot copies it rather
    /// than walking the streams.
    durable_marks: Vec<Watermark>,
    tree: Tree,
    streams: IdMap<Stream>,
    /// Gossip: what each member reported as applied, per origin.
    applied_by: BTreeMap<ReplicaId, Report>,
    /// When each member last reported: its heartbeat's timestamp (it had applied at
    /// least what it reported by then), and when the report arrived here
    /// (`Now::mono_us`).
    reported_at: BTreeMap<ReplicaId, (Timestamp, u64)>,
    /// When this replica began hearing each member's reports again after a
    /// silence longer than the gossip window (its own clock's reading then);
    /// `Timestamp::ZERO` for a member heard without a break since this process
    /// first heard it. Bounded staleness is promised with respect to the
    /// replicas heard since `t − d` ([`Replica::vouch`]).
    heard_since: BTreeMap<ReplicaId, Timestamp>,
    /// Per origin of `origin_ids`, for origins suspected down: the vouched time
    /// ([`Replica::vouch`], [`ScopeWatermarks::freshness`]). `None` while no origin
    /// is vouched for.
    vouched: Option<Arc<[Timestamp]>>,
    /// A time no write of any origin of the scope is stamped before (set for a
    /// replica created with its whole deployment): the least vouched time.
    created_floor: Timestamp,
    purge_horizon: Timestamp,
    /// Heartbeats to forward, newest per origin, in origin order: (heartbeat, the
    /// neighbour it came from). A vector drained in place, so its room is reused.
    heartbeat_news: Vec<(Heartbeat, ReplicaId)>,
    /// An incoming snapshot, if one is being installed.
    incoming: Option<Incoming>,
    /// Members that recently sent us their own heartbeat flagged `tree_edge`, until
    /// when: those that hold us as a tree neighbour. We forward to them as if they
    /// were tree neighbours: when views of the tree differ (a topology rollout,
    /// different suspicions), each side still reaches the other, so no replica is
    /// left without a feed (I8).
    ///
    /// Only a sender's own heartbeats count, and a replica flags those to its tree
    /// neighbours only (not to inbound neighbours, not to the members it probes). Adopting
    /// on any traffic let two replicas keep each other inbound for ever by
    /// forwarding to each other: every tree a failure made left its edges behind,
    /// and after a few failures entries went out over a near-mesh (15 copies per
    /// apply in the `rolling-restart` drill).
    inbound: BTreeMap<ReplicaId, u64>,
    /// The highest sequence of this replica's own stream some client waits to see
    /// applied in other regions ([`Replica::want_reports`]), sent in its
    /// heartbeats as `report_after`; 0: none.
    report_after: u64,
    /// Origins that asked for reports (`Heartbeat::report_after`): per origin, the
    /// sequence asked and the highest sequence this replica has reported for.
    reports_asked: BTreeMap<ReplicaId, (u64, u64)>,
}

/// Whether this replica hears `p`'s applied-watermark reports in a scope.
enum Heard {
    /// Its last report (made at this time) arrived within the window, and `p` is
    /// not suspected.
    Lately(Timestamp),
    /// Suspected, or its last report is older than the window.
    NotLately,
    /// Not suspected, and no report ever arrived.
    NeverReported,
}

fn heard_report(s: &ScopeState, peers: &Peers, p: &ReplicaId, now: Now, window_us: u64) -> Heard {
    let suspected = peers.get(p).is_none_or(|x| x.suspected);
    match s.reported_at.get(p) {
        None if suspected => Heard::NotLately,
        None => Heard::NeverReported,
        Some((at, received_us)) => {
            if suspected || now.mono_us.saturating_sub(*received_us) > window_us {
                Heard::NotLately
            } else {
                Heard::Lately(*at)
            }
        }
    }
}

/// Lists `st` (the stream of `origin` in `scope`) for the next flush, once.
fn list_moved(
    moved: &mut Vec<(ScopeId, ReplicaId)>,
    st: &mut Stream,
    scope: &ScopeId,
    origin: &ReplicaId,
) {
    if !st.listed {
        st.listed = true;
        moved.push((scope.clone(), origin.clone()));
    }
}

/// Sets `origin`'s entry of a scope's durable watermarks by origin
/// (`ScopeState::durable_marks`, in the order of `origins` and `origin_ids`), if
/// it is one of the scope's origins.
fn set_mark(origins: &Roster, marks: &mut [Watermark], origin: &ReplicaId, wm: Watermark) {
    if let Some(i) = origins.position(origin) {
        marks[i] = wm;
    }
}

/// The stream of `origin` in `scope`, if both exist.
fn stream_of<'a>(
    scopes: &'a mut BTreeMap<ScopeId, ScopeState>,
    scope: &ScopeId,
    origin: &ReplicaId,
) -> Option<&'a mut Stream> {
    scopes.get_mut(scope)?.streams.get_mut(origin)
}

impl ScopeState {
    /// Where this replica forwards: its tree neighbours, then its inbound neighbours
    /// that are not among them.
    fn forward_set<'a>(&'a self, me: &ReplicaId) -> impl Iterator<Item = &'a ReplicaId> + 'a {
        let tree = self.tree.neighbours(me);
        tree.iter()
            .chain(self.inbound.keys().filter(move |n| !tree.contains(n)))
    }

    /// Each origin's durable watermark (zero for one never heard from), in origin
    /// order. Origins and streams are both in id order: they are walked together
    /// rather than each origin looked up.
    fn durable_watermarks(&self) -> impl Iterator<Item = (ReplicaId, Watermark)> + '_ {
        debug_assert!(
            self.durable_marks
                .iter()
                .copied()
                .eq(self.walk_durable_marks())
        );
        self.origin_ids
            .iter()
            .zip(&self.durable_marks)
            .map(|(o, wm)| (o.clone(), *wm))
    }

    /// Sets `origin`'s durable watermark (its stream exists).
    fn set_durable(&mut self, origin: &ReplicaId, wm: Watermark) {
        if let Some(st) = self.streams.get_mut(origin) {
            st.durable = wm;
        }
        set_mark(&self.origins, &mut self.durable_marks, origin, wm);
    }

    /// Recomputes `origin_ids` and `durable_marks` from `origins` and the streams.
    fn refresh_origins(&mut self) {
        // Vouched times follow their origins to their new places.
        let vouched = self.vouched.take().map(|v| {
            let old: Vec<(&ReplicaId, Timestamp)> =
                self.origin_ids.iter().zip(v.iter().copied()).collect();
            self.origins
                .iter()
                .map(|o| {
                    old.iter()
                        .find(|(id, _)| *id == o)
                        .map_or(Timestamp::ZERO, |(_, t)| *t)
                })
                .collect::<Arc<[Timestamp]>>()
        });
        self.origin_ids = self.origins.iter().cloned().collect();
        self.durable_marks = self.walk_durable_marks().collect();
        self.vouched = vouched;
    }

    /// [`ScopeState::durable_watermarks`] without the ids, walking the streams: in
    /// `origin_ids` order.
    fn walk_durable_marks(&self) -> impl Iterator<Item = Watermark> + '_ {
        let mut streams = self.streams.iter().peekable();
        self.origins.iter().map(move |o| {
            while streams.next_if(|(id, _)| *id < o).is_some() {}
            streams
                .next_if(|(id, _)| *id == o)
                .map_or_else(Watermark::default, |(_, st)| st.durable)
        })
    }

    fn adopt(&mut self, from: &ReplicaId, until_us: u64) {
        if !self.members.contains(from) {
            return;
        }
        match self.inbound.get_mut(from) {
            Some(t) => *t = until_us,
            None => {
                self.inbound.insert(from.clone(), until_us);
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Incoming {
    from: ReplicaId,
    snapshot_id: Option<u64>,
    next_index: u32,
    rows: u64,
    asked_at_us: u64,
}

#[derive(Debug, Clone)]
struct Outgoing {
    scope: ScopeId,
    snapshot_id: u64,
    index: u32,
    watermarks: Vec<(ReplicaId, Watermark)>,
    tables: VecDeque<Arc<str>>,
    after: Option<Bytes>,
    /// The parts of a row larger than a chunk not sent yet (`RowState::split`),
    /// one chunk each, before any further row.
    parts: VecDeque<(Bytes, RowState)>,
}

#[derive(Debug, Clone, Default)]
struct Peer {
    last_heard_us: u64,
    suspected: bool,
    /// Heard from at least once since this replica started.
    heard: bool,
    inflight_bytes: usize,
    /// Mutations waiting to be batched, and their bytes.
    mutations: VecDeque<(LogEntry, usize)>,
    queued_bytes: usize,
    /// Heartbeats waiting to be batched.
    heartbeats: Vec<Heartbeat>,
    /// Other frames, in order.
    frames: VecDeque<Frame>,
    /// Snapshots this replica streams to the peer.
    outgoing: VecDeque<Outgoing>,
}

impl Peer {
    fn new(last_heard_us: u64) -> Peer {
        Peer {
            last_heard_us,
            ..Default::default()
        }
    }

    /// Whether `Replica::next_for` has a frame for this peer now.
    #[cfg(debug_assertions)]
    fn ready(&self, inflight_bytes_max: usize) -> bool {
        !self.heartbeats.is_empty()
            || !self.frames.is_empty()
            || (self.inflight_bytes < inflight_bytes_max
                && (!self.mutations.is_empty() || !self.outgoing.is_empty()))
    }
}

/// The peers, in id order: `poll_transmit` walks them by position (no map lookups,
/// no copy of the ids), other paths find one by id ([`IdMap`]: ids handed around
/// are mostly clones of the ones held here, found by address).
#[derive(Debug, Default)]
struct Peers {
    list: IdMap<Peer>,
    /// The peers that may have a frame ready, one bit per position in `list`:
    /// [`Peers::get_mut`] marks its peer (and a change of the list every peer),
    /// `poll_transmit` unmarks a peer it finds nothing for. A peer with a frame
    /// ready is always marked, so `poll_transmit` visits only marked peers: a
    /// walk over every peer after every turn was an eighth of the simulator's L1
    /// cache misses, and the walk after each frame sent 2 % of its instructions.
    marked: Vec<u64>,
}

impl Peers {
    fn position(&self, id: &ReplicaId) -> Result<usize, usize> {
        self.list.position(id)
    }

    fn get(&self, id: &ReplicaId) -> Option<&Peer> {
        self.list.get(id)
    }

    /// The peer, to queue frames for or to release in-flight bytes: it may be
    /// ready to send afterwards.
    fn get_mut(&mut self, id: &ReplicaId) -> Option<&mut Peer> {
        let i = self.position(id).ok()?;
        self.marked[i / 64] |= 1 << (i % 64);
        Some(self.list.at_mut(i).1)
    }

    fn unmark(&mut self, i: usize) {
        self.marked[i / 64] &= !(1 << (i % 64));
    }

    /// Marks every peer (positions move when the list changes).
    fn mark_all(&mut self) {
        let n = self.list.len();
        self.marked = vec![!0; n.div_ceil(64)];
        if !n.is_multiple_of(64)
            && let Some(last) = self.marked.last_mut()
        {
            *last = (1 << (n % 64)) - 1;
        }
    }

    /// The first marked position at or after `from` (a position), else the first
    /// marked one before it: the round-robin order.
    fn next_marked(&self, from: usize) -> Option<usize> {
        let (w0, b0) = (from / 64, from % 64);
        let at = |w: usize, bits: u64| w * 64 + bits.trailing_zeros() as usize;
        let head = self.marked.get(w0).map_or(0, |w| w & (!0 << b0));
        if head != 0 {
            return Some(at(w0, head));
        }
        if let Some((w, bits)) = self
            .marked
            .iter()
            .enumerate()
            .skip(w0 + 1)
            .find(|(_, bits)| **bits != 0)
        {
            return Some(at(w, *bits));
        }
        self.marked
            .iter()
            .enumerate()
            .take(w0 + 1)
            .map(|(w, bits)| (w, if w == w0 { bits & !(!0 << b0) } else { *bits }))
            .find(|(_, bits)| *bits != 0)
            .map(|(w, bits)| at(w, bits))
    }

    /// The peer's liveness (when last heard, whether suspected), which has no
    /// bearing on what it is sent: unlike [`Peers::get_mut`], marks nothing.
    fn liveness_mut(&mut self, id: &ReplicaId) -> Option<(&mut u64, &mut bool)> {
        let p = self.list.get_mut(id)?;
        Some((&mut p.last_heard_us, &mut p.suspected))
    }

    fn contains_key(&self, id: &ReplicaId) -> bool {
        self.position(id).is_ok()
    }

    /// Adds `id` (with `peer`) unless present.
    fn insert_if_absent(&mut self, id: &ReplicaId, peer: impl FnOnce() -> Peer) {
        if self.list.get(id).is_none() {
            self.list.insert(id, peer());
            self.mark_all(); // positions moved
        }
    }

    fn retain(&mut self, mut keep: impl FnMut(&ReplicaId) -> bool) {
        self.list.retain(&mut keep);
        self.mark_all(); // positions moved
    }

    fn len(&self) -> usize {
        self.list.len()
    }

    fn iter(&self) -> impl Iterator<Item = (&ReplicaId, &Peer)> {
        self.list.iter()
    }
}

/// Notes that `peer` was heard from now; whether it was suspected until now.
fn note_heard(peers: &mut Peers, now: Now, peer: &ReplicaId) -> bool {
    match peers.list.get_mut(peer) {
        Some(p) => {
            p.last_heard_us = now.mono_us;
            p.heard = true;
            std::mem::replace(&mut p.suspected, false)
        }
        None => false,
    }
}

/// How recent a peer's heartbeat must be to count toward the clock fence.
pub const CLOCK_FENCE_WINDOW_US: u64 = 10_000_000;

/// One peer's clock against ours: heartbeat wall time minus ours on arrival (ms),
/// the largest over two half-windows. A heartbeat can only arrive late, never early,
/// so the largest reading is the freshest: a backlog of old heartbeats (after a
/// partition, a pause, a slow link) does not make our clock look ahead.
#[derive(Debug, Clone, Copy)]
struct PeerClock {
    best: i64,
    since_us: u64,
    previous_best: Option<i64>,
    last_us: u64,
}

impl PeerClock {
    fn new(offset_ms: i64, now_us: u64) -> Self {
        PeerClock {
            best: offset_ms,
            since_us: now_us,
            previous_best: None,
            last_us: now_us,
        }
    }

    fn record(&mut self, offset_ms: i64, now_us: u64) {
        if now_us.saturating_sub(self.since_us) > CLOCK_FENCE_WINDOW_US / 2 {
            self.previous_best = Some(self.best);
            self.best = offset_ms;
            self.since_us = now_us;
        } else {
            self.best = self.best.max(offset_ms);
        }
        self.last_us = now_us;
    }

    /// The freshest reading, if the peer was heard within the window.
    fn offset(&self, now_us: u64) -> Option<i64> {
        (now_us.saturating_sub(self.last_us) <= CLOCK_FENCE_WINDOW_US)
            .then(|| self.previous_best.map_or(self.best, |p| p.max(self.best)))
    }
}

/// A replica of one deployment. See the module documentation.
#[derive(Debug)]
pub struct Replica<S: Storage> {
    id: ReplicaId,
    deployment: Arc<Deployment>,
    config: Config,
    storage: S,
    clock: HybridClock,
    /// Per origin heard from: how far its clock reads from ours. Decides the clock
    /// fence ([`Replica::clock_fence`]).
    peer_clocks: IdMap<PeerClock>,
    rng: crate::rng::Rng,
    stores_rows: bool,
    scopes: BTreeMap<ScopeId, ScopeState>,
    peers: Peers,
    /// Round-robin position over peers in `poll_transmit`, for fairness.
    next_peer: usize,
    events: VecDeque<Event>,
    /// Local writes applied but not yet durable: forwarded and acknowledged at flush.
    unflushed: Vec<LogEntry>,
    /// Streams whose `applied` watermark moved since the last flush (each once, see
    /// [`Stream::listed`]): the only ones `flush` visits. A replica holds tens of
    /// streams and flushes after every input; visiting them all was an eighth of
    /// the simulator's L1 cache misses.
    moved: Vec<(ScopeId, ReplicaId)>,
    /// Scratch of `flush`: the moved streams whose durable watermark it advanced
    /// (position in `moved`, before, after).
    advanced: Vec<(usize, Watermark, Watermark)>,
    next_heartbeat_us: u64,
    heartbeats_sent: u64,
    forward_heartbeats_at_us: Option<u64>,
    next_probe_us: u64,
    next_compaction_us: u64,
    /// When a log purge that stopped at its budget goes on
    /// ([`Replica::purge_logs`]), before the next compaction.
    purge_again_at_us: Option<u64>,
    next_check_us: u64,
    /// Where the compaction sweep resumes: (table, after this key).
    sweep: Option<(Arc<str>, Bytes)>,
    /// Location metadata (the `_location` table): run-time placement overrides.
    location: Location,
    /// Prefixes whose rows a flip moved away from this replica, purged by
    /// [`Replica::purge_moved_rows`] once the driver has published the new location
    /// (so no read sees a purged row under the old placement).
    pending_purges: Vec<(Arc<str>, Bytes, String)>,
    /// Parts of migration jobs this process was given to run (`_jobs` rows its
    /// replica's process 0 recorded, just applied), for the driver
    /// ([`Replica::take_assigned_jobs`]).
    assigned_jobs: Vec<pb::MigrationJob>,
    /// Scopes whose own stream this replica is relearning from its peers
    /// ([`Replica::relearn_own_streams`]); it writes in none of them.
    relearning: BTreeMap<ScopeId, Relearning>,
    /// Scopes this process joined as a resize's follower (a group moving to it,
    /// `Deployment::leader_of`), by the process it follows: each is filled by a
    /// snapshot from that process — asked again should it stall — then by the
    /// stream.
    copying: BTreeMap<ScopeId, ReplicaId>,
    /// Change-stream readers this replica keeps its log for
    /// ([`Replica::register_reader`]).
    readers: crate::changes::Readers,
    stats: Stats,
}

/// A scope in which this replica does not know how far its own stream went: its
/// store is new, and a replica of the same id may have written before (a lost disk).
#[derive(Debug, Default)]
struct Relearning {
    /// The scope's other origins that reported their applied watermarks since.
    reported: BTreeSet<ReplicaId>,
    /// When the first of them did.
    first_report_us: Option<u64>,
}

impl<S: Storage> Replica<S> {
    /// Opens the replica `id` over `storage`, restoring its streams and clock from
    /// what the storage holds (after a crash too).
    pub fn new(
        id: ReplicaId,
        deployment: Arc<Deployment>,
        config: Config,
        storage: S,
        seed: u64,
        now: Now,
    ) -> Result<Self, Error> {
        let role = deployment
            .topology
            .replica(id.as_str())
            .map(|r| r.role)
            .ok_or_else(|| Error::malformed("replica", format!("{id} is not in the topology")))?;
        let mut r = Replica {
            id,
            clock: HybridClock::new(config.max_offset_ms),
            peer_clocks: IdMap::default(),
            deployment,
            config,
            storage,
            rng: crate::rng::Rng::new(seed),
            stores_rows: role.stores_rows(),
            scopes: BTreeMap::new(),
            peers: Peers::default(),
            next_peer: 0,
            events: VecDeque::new(),
            unflushed: Vec::new(),
            moved: Vec::new(),
            advanced: Vec::new(),
            next_heartbeat_us: now.mono_us,
            heartbeats_sent: 0,
            forward_heartbeats_at_us: None,
            next_probe_us: now.mono_us,
            next_compaction_us: now.mono_us,
            purge_again_at_us: None,
            next_check_us: now.mono_us,
            sweep: None,
            location: Location::new(),
            pending_purges: Vec::new(),
            assigned_jobs: Vec::new(),
            relearning: BTreeMap::new(),
            copying: BTreeMap::new(),
            readers: crate::changes::Readers::default(),
            stats: Stats::default(),
        };
        // Its streams come from the store just below, every scope's at once.
        r.rebuild_scope_states(now);
        // Location metadata, as this replica last applied it.
        r.reload_location(now)?;
        // The change-stream readers it keeps its log for. Unreadable ones
        // (written by another version) hold nothing: the log falls back to the
        // tables' retention, and each reader registers again as it reads.
        if let Some(bytes) = r.storage.meta(crate::changes::READERS_META)? {
            r.readers = crate::changes::Readers::decode(&bytes).unwrap_or_default();
        }
        // Restore durable watermarks; the clock never issues below what we wrote (I1).
        for (scope, origin, wm) in r.storage.watermarks()? {
            if origin == r.id {
                r.clock.restore(wm.timestamp);
            }
            if let Some(s) = r.scopes.get_mut(&scope) {
                let st = s.streams.get_or_default(&origin);
                st.applied = wm;
                st.known_last = wm.sequence;
                s.set_durable(&origin, wm);
            }
        }
        Ok(r)
    }

    pub fn id(&self) -> &ReplicaId {
        &self.id
    }

    /// Registers the change-stream reader `name` at `cursor`, or moves it
    /// there: the log entries after the cursor stay past the tables'
    /// retention while it comes back within
    /// [`READER_IDLE_MAX_MS`](crate::changes::READER_IDLE_MAX_MS). Written with
    /// the next store write, durable with the next sync. A bad name, or a new
    /// reader past [`READERS_MAX`](crate::changes::READERS_MAX), is refused.
    pub fn register_reader(
        &mut self,
        now: Now,
        name: &str,
        cursor: crate::changes::Cursor,
    ) -> Result<(), Error> {
        self.readers
            .register(name, cursor, now.wall_ms)
            .map_err(|e| Error::malformed("reader", e))?;
        self.storage.write(WriteBatch {
            meta: vec![(
                crate::changes::READERS_META.to_owned(),
                Some(self.readers.encode()),
            )],
            ..WriteBatch::default()
        })?;
        Ok(())
    }

    /// The change-stream readers this replica keeps its log for.
    pub fn readers(&self) -> &crate::changes::Readers {
        &self.readers
    }

    pub fn deployment(&self) -> &Arc<Deployment> {
        &self.deployment
    }

    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// For tests and tools that need to reach the store (e.g. to crash it).
    pub fn storage_mut(&mut self) -> &mut S {
        &mut self.storage
    }

    pub fn into_storage(self) -> S {
        self.storage
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The scopes this replica belongs to.
    pub fn scopes(&self) -> impl Iterator<Item = &ScopeId> {
        self.scopes.keys()
    }

    /// Whether this replica belongs to `scope`.
    pub fn belongs_to(&self, scope: &ScopeId) -> bool {
        self.scopes.contains_key(scope)
    }

    /// The parts of migration jobs this process was given since the last call:
    /// rows of `_jobs` that its replica's process 0 recorded for it (applied in
    /// the system scope's stream, or installed by a snapshot of it). The driver
    /// runs each ([`crate::migration::Job::resumed`]) unless it already does.
    pub fn take_assigned_jobs(&mut self) -> Vec<pb::MigrationJob> {
        std::mem::take(&mut self.assigned_jobs)
    }

    /// The current tree of a scope, as this replica sees it.
    pub fn tree(&self, scope: &ScopeId) -> Option<&Tree> {
        self.scopes.get(scope).map(|s| &s.tree)
    }

    /// Durable watermarks for `scope`: what reads may rely on (I6).
    pub fn watermarks(&self, scope: &ScopeId) -> Option<ScopeWatermarks> {
        let s = self.scopes.get(scope)?;
        debug_assert!(s.durable_marks.iter().copied().eq(s.walk_durable_marks()));
        Some(
            ScopeWatermarks::from_shared(
                scope.clone(),
                s.origin_ids.clone(),
                s.durable_marks.clone(),
            )
            .with_vouched(s.vouched.clone()),
        )
    }

    /// Catch-up progress: for every stream of every scope, what is durable here and
    /// the highest sequence known to exist (from heartbeats, frames and gap answers).
    /// A replica that just joined or restarted compares the two to tell when it has
    /// caught up with the cluster (the node's readiness gate).
    pub fn stream_progress(&self) -> impl Iterator<Item = StreamProgress<'_>> {
        self.scopes.iter().flat_map(|(scope, s)| {
            s.streams.iter().map(move |(origin, st)| StreamProgress {
                scope,
                origin,
                durable: st.durable.sequence,
                known_last: st.known_last,
            })
        })
    }

    /// The scopes this replica shares with other replicas none of which it has
    /// heard from since it started. A replica that has never caught up waits for a
    /// peer of each before it trusts what it holds (the node's readiness gate).
    pub fn unheard_scopes(&self) -> Vec<ScopeId> {
        self.scopes
            .iter()
            .filter(|(_, s)| {
                let mut others = s.members.iter().filter(|m| **m != self.id).peekable();
                others.peek().is_some()
                    && !others.any(|m| self.peers.list.get(m).is_some_and(|p| p.heard))
            })
            .map(|(scope, _)| scope.clone())
            .collect()
    }

    /// Tells this replica that its store may not hold its own streams: the store is
    /// new, and a replica of the same id may have written before (its disk was
    /// lost and it came back empty under its old id). A (scope, origin, sequence)
    /// names one write for ever (I11): writing from sequence 1 again would reuse
    /// sequences, and peers would drop the new writes as duplicates of the old.
    /// So in every scope it writes in, until it has relearned how far its own
    /// stream went, the replica
    /// - refuses writes ([`Error::OwnStreamUnknown`]: the client writes elsewhere);
    /// - takes the furthest sequence of its own stream that another origin of the
    ///   scope reports applied (applied-watermark gossip) as the stream's end, and
    ///   accepts its own entries from peers up to there (gap repair, snapshots);
    /// - heartbeats without a promise about its stream (no timestamp beyond what
    ///   it holds), so no peer's watermark moves on its word.
    ///
    /// A scope is relearned once every other origin of it has reported, or one has
    /// and two gossip periods have passed (an origin that is down cannot report),
    /// and the stream holds all that was reported. A replica that is the only
    /// origin of a scope has nobody to learn from and writes at once. What stays
    /// possible: an origin unreachable throughout that holds more of the old stream
    /// than every reachable one drops the writes that reuse those sequences.
    ///
    /// The node calls this for a store it does not trust (no readiness record): a
    /// replica created with a new cluster, or one that caught up once, holds its
    /// own streams durably and never needs it.
    pub fn relearn_own_streams(&mut self, now: Now) {
        if !self.stores_rows {
            return;
        }
        for (scope, s) in &self.scopes {
            if s.origins.contains(&self.id) {
                self.relearning.insert(scope.clone(), Relearning::default());
            }
        }
        self.settle_relearning(now);
    }

    /// Tells this replica that it was created at `now` together with every other
    /// replica of its deployment, on empty stores (a simulated cluster at time
    /// zero): no write of any origin can be stamped earlier than `now` less the
    /// clocks' largest allowed offset, so it vouches for every origin up to
    /// there ([`ScopeWatermarks::freshness`]) before any heartbeat has arrived.
    /// Not for a live cluster, whose replicas start one after another (there the
    /// readiness gate keeps reads away until the first heartbeats are in).
    pub fn created_with_deployment(&mut self, now: Now) {
        let before = Timestamp::new(now.wall_ms.saturating_sub(self.clock.max_offset_ms()), 0);
        for s in self.scopes.values_mut() {
            s.created_floor = before;
            let v: Vec<Timestamp> = match &s.vouched {
                Some(v) => v.iter().map(|t| (*t).max(before)).collect(),
                None => vec![before; s.origin_ids.len()],
            };
            s.vouched = Some(v.into());
        }
    }

    /// The scopes whose own stream this replica is still relearning
    /// ([`Replica::relearn_own_streams`]); it writes in none of them.
    pub fn relearning_scopes(&self) -> impl Iterator<Item = &ScopeId> {
        self.relearning.keys()
    }

    /// Ends relearning in the scopes where it is done (see
    /// [`Replica::relearn_own_streams`]).
    fn settle_relearning(&mut self, now: Now) {
        if self.relearning.is_empty() {
            return;
        }
        let window_us = self.gossip_window_us();
        let mut learned = Vec::new();
        for (scope, r) in &self.relearning {
            let Some(s) = self.scopes.get(scope) else {
                learned.push((scope.clone(), None));
                continue;
            };
            let mut others = s.origins.iter().filter(|o| **o != self.id).peekable();
            let alone = others.peek().is_none();
            let all_reported = others.all(|o| r.reported.contains(o));
            let waited = r
                .first_report_us
                .is_some_and(|t| now.mono_us >= t + window_us);
            let (known_last, applied) = s
                .streams
                .get(&self.id)
                .map_or((0, 0), |st| (st.known_last, st.applied.sequence));
            let heard = alone || (r.first_report_us.is_some() && (all_reported || waited));
            if heard && s.incoming.is_none() && applied >= known_last {
                learned.push((scope.clone(), Some(applied)));
            }
        }
        for (scope, sequence) in learned {
            self.relearning.remove(&scope);
            if let Some(sequence) = sequence {
                self.events
                    .push_back(Event::OwnStreamLearned { scope, sequence });
            }
        }
    }

    /// The purge horizon this replica computed for `scope`.
    pub fn purge_horizon(&self, scope: &ScopeId) -> Option<Timestamp> {
        self.scopes.get(scope).map(|s| s.purge_horizon)
    }

    /// Location metadata as this replica has applied it.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// The effective scope of a row: its location entry, else the placement file.
    pub fn scope_of(&self, table: &str, key: &[u8]) -> ScopeId {
        self.location.scope_of(&self.deployment, table, key)
    }

    /// Whether this replica may store a row: its scope allows us, or a migration is
    /// moving it to a scope that does.
    fn may_hold(&self, table: &str, key: &[u8]) -> bool {
        // `scope_of` and `Location::migrating_to` with one lookup and no clone.
        let d = &self.deployment;
        let entry = self.location.lookup(table, key);
        let ours = if table.starts_with('_') {
            self.scopes.contains_key(d.system_scope())
        } else {
            let scope = match entry {
                Some(e) => d.group_scope(&e.policy, table, key),
                None => d.scope_of(table, key),
            };
            self.scopes.contains_key(scope)
        };
        ours || entry
            .and_then(|e| e.migrating_to.as_ref())
            .is_some_and(|b| self.scopes.contains_key(d.group_scope(b, table, key)))
    }

    /// Whether this replica's write `token` is durable here.
    pub fn is_durable(&self, token: &Token) -> bool {
        self.scopes
            .get(&token.scope)
            .and_then(|s| s.streams.get(&token.origin))
            .is_some_and(|st| st.durable.sequence >= token.sequence)
    }

    /// Whether every member of `scope` has reported applying `origin`'s stream up to
    /// `sequence` (from the applied-watermark gossip of heartbeats). Relays the
    /// scope's tree leaves out are not asked: they store nothing and forward
    /// nothing (the second process of a relay, say), so nothing reaches them to
    /// report.
    pub fn applied_everywhere(&self, scope: &ScopeId, origin: &ReplicaId, sequence: u64) -> bool {
        let Some(s) = self.scopes.get(scope) else {
            return false;
        };
        let relays = &self.deployment.topology.replicas;
        let idle = |m: &ReplicaId| {
            !s.tree.contains(m) && relays.get(m).is_some_and(|r| r.role == Role::Relay)
        };
        s.members.iter().filter(|m| !idle(m)).all(|m| {
            if m == &self.id {
                s.streams
                    .get(origin)
                    .is_some_and(|st| st.durable.sequence >= sequence)
            } else {
                s.applied_by
                    .get(m)
                    .and_then(|w| w.get(origin))
                    .is_some_and(|w| w.sequence >= sequence)
            }
        })
    }

    /// A client waits for this replica's write `sequence` in `scope` to be applied
    /// in other regions: from now on its heartbeats ask every member to report,
    /// once it has applied that far, at once rather than at its next periodic
    /// report ([`Replica::regions_applied`] then reads the answers).
    pub fn want_reports(&mut self, scope: &ScopeId, sequence: u64) {
        if let Some(s) = self.scopes.get_mut(scope) {
            s.report_after = s.report_after.max(sequence);
        }
    }

    /// The regions where a replica that stores rows has durably applied `origin`'s
    /// stream in `scope` up to `sequence`, as far as this replica knows (its own
    /// durable state and its members' applied-watermark reports), and the regions
    /// of the scope's members that store rows: what a write waiting for
    /// replication has reached, out of what it could. `None` for a scope this
    /// replica is not a member of.
    pub fn regions_applied(
        &self,
        scope: &ScopeId,
        origin: &ReplicaId,
        sequence: u64,
    ) -> Option<(BTreeSet<RegionId>, BTreeSet<RegionId>)> {
        let s = self.scopes.get(scope)?;
        let topology = &self.deployment.topology;
        let (mut reached, mut all) = (BTreeSet::new(), BTreeSet::new());
        for m in s.members.iter() {
            let Some(r) = topology.replicas.get(m).filter(|r| r.role.stores_rows()) else {
                continue;
            };
            all.insert(r.region.clone());
            let applied = if m == &self.id {
                s.streams.get(origin).map(|st| st.durable.sequence)
            } else {
                s.applied_by
                    .get(m)
                    .and_then(|w| w.get(origin))
                    .map(|w| w.sequence)
            };
            if applied.is_some_and(|a| a >= sequence) {
                reached.insert(r.region.clone());
            }
        }
        Some((reached, all))
    }

    /// A one-line-per-stream dump of replication state, for diagnosing a stuck
    /// stream (checkers print it when a run does not converge).
    pub fn debug_state(&self) -> String {
        let mut out = String::new();
        for (scope, s) in &self.scopes {
            let neighbours: Vec<&str> = s
                .tree
                .neighbours(&self.id)
                .iter()
                .map(|r| r.as_str())
                .collect();
            out += &format!(
                "{} scope {scope}: tree neighbours {neighbours:?}, incoming {:?}\n",
                self.id, s.incoming
            );
            for (o, st) in &s.streams {
                out += &format!(
                    "  {o}: applied #{} durable #{} known #{} pending {:?} hb {:?} hint {:?} behind {:?} gap {:?}\n",
                    st.applied.sequence,
                    st.durable.sequence,
                    st.known_last,
                    st.pending.keys().collect::<Vec<_>>(),
                    st.heartbeat,
                    st.hint,
                    st.behind_since_us,
                    st.gap
                );
            }
        }
        let suspected: Vec<&str> = self.suspected().map(|r| r.as_str()).collect();
        out += &format!("  suspected {suspected:?}\n");
        out
    }

    /// Replication bytes handed to the driver for each peer and not yet reported sent.
    pub fn inflight_bytes(&self) -> impl Iterator<Item = (&ReplicaId, usize)> {
        self.peers.iter().map(|(id, p)| (id, p.inflight_bytes))
    }

    pub fn suspected(&self) -> impl Iterator<Item = &ReplicaId> {
        self.peers
            .iter()
            .filter(|(_, p)| p.suspected)
            .map(|(id, _)| id)
    }

    fn live_set(&self, members: &BTreeSet<ReplicaId>) -> BTreeSet<ReplicaId> {
        members
            .iter()
            .filter(|m| **m == self.id || !self.peers.get(m).is_some_and(|p| p.suspected))
            .cloned()
            .collect()
    }

    /// (Re)computes scopes, members and trees from the deployment and the live view.
    #[cold]
    fn rebuild_scopes(&mut self, now: Now) {
        let added = self.rebuild_scope_states(now);
        self.restore_own_streams(now, &added);
    }

    /// [`Replica::rebuild_scopes`] but for the own streams of the scopes it
    /// adds, which it returns.
    #[cold]
    fn rebuild_scope_states(&mut self, now: Now) -> Vec<ScopeId> {
        let d = self.deployment.clone();
        let mine: BTreeSet<ScopeId> = d
            .scopes()
            .filter(|s| d.allowed(&self.id, s))
            .cloned()
            .collect();
        // A group this process stops hosting while its policy keeps this region
        // (a resize finished, moving it to another process of the replica): its
        // rows go, once the driver has published the new view.
        let region = d.topology.replica(self.id.as_str()).map(|r| &r.region);
        let moved_away = self.scopes.keys().any(|s| {
            !mine.contains(s)
                && s.group().is_some()
                && d.placement
                    .policy(s)
                    .is_some_and(|p| region.is_some_and(|r| p.regions.contains(r)))
        });
        if moved_away && self.stores_rows {
            for table in d.placement.schema.user_tables() {
                self.pending_purges
                    .push((table.clone(), Bytes::new(), RESIZE_PURGE.to_owned()));
            }
        }
        self.scopes.retain(|s, _| mine.contains(s));
        self.copying.retain(|s, _| mine.contains(s));
        let me = d.topology.replica(self.id.as_str());
        let mut joined: Vec<(ScopeId, ReplicaId)> = Vec::new();
        let mut added: Vec<ScopeId> = Vec::new();
        // The shard groups of a policy share its members and tree, unless its
        // replicas run many processes (each group's members are then the
        // processes hosting it): worked out once per member set, the rosters
        // shared and the tree named after each group's scope.
        type Shared = (Arc<Roster>, Arc<Roster>, Tree);
        let mut of_members: BTreeMap<BTreeSet<ReplicaId>, Shared> = BTreeMap::new();
        for scope in &mine {
            let members = d.scope_members(scope);
            let (members, origins, tree) = match of_members.get(&members) {
                Some((members, origins, tree)) => {
                    let mut tree = tree.clone();
                    tree.scope = scope.clone();
                    (members.clone(), origins.clone(), tree)
                }
                None => {
                    for m in members.iter().filter(|m| **m != self.id) {
                        self.peers.insert_if_absent(m, || Peer::new(now.mono_us));
                    }
                    let origins: BTreeSet<ReplicaId> = members
                        .iter()
                        .filter(|m| d.topology.replicas[*m].role.stores_rows())
                        .cloned()
                        .collect();
                    let live = self.live_set(&members);
                    let tree = d.tree(scope, Some(&live));
                    let shared: Shared = (
                        Arc::new(members.clone().into()),
                        Arc::new(origins.into()),
                        tree,
                    );
                    of_members.insert(members, shared.clone());
                    shared
                }
            };
            match self.scopes.get_mut(scope) {
                Some(s) => {
                    if s.tree != tree {
                        self.events.push_back(Event::TreeChanged {
                            scope: scope.clone(),
                            edges: tree.edges.len(),
                        });
                    }
                    s.tree = tree;
                    s.members = members;
                    if !s.origins.iter().eq(origins.iter()) {
                        s.origins = origins;
                        s.refresh_origins();
                    }
                }
                None => {
                    if let Some(leader) = me.and_then(|me| d.leader_of(me, scope))
                        && self.stores_rows
                    {
                        joined.push((scope.clone(), leader.id.clone()));
                    }
                    added.push(scope.clone());
                    self.scopes.insert(
                        scope.clone(),
                        ScopeState {
                            members,
                            origin_ids: origins.iter().cloned().collect(),
                            durable_marks: vec![Watermark::default(); origins.len()],
                            origins,
                            tree,
                            streams: IdMap::default(),
                            applied_by: BTreeMap::new(),
                            reported_at: BTreeMap::new(),
                            heard_since: BTreeMap::new(),
                            vouched: None,
                            created_floor: Timestamp::ZERO,
                            purge_horizon: Timestamp::ZERO,
                            heartbeat_news: Vec::new(),
                            incoming: None,
                            inbound: BTreeMap::new(),
                            report_after: 0,
                            reports_asked: BTreeMap::new(),
                        },
                    );
                }
            }
        }
        let all_members: BTreeSet<ReplicaId> = self
            .scopes
            .values()
            .flat_map(|s| s.members.iter().cloned())
            .collect();
        self.peers.retain(|id| all_members.contains(id));
        for (scope, leader) in joined {
            self.request_snapshot(now, &scope, &leader);
            self.copying.insert(scope, leader);
        }
        added
    }

    /// For scopes this process (re)joins while running: how far its own stream
    /// went there, should it have hosted them before (a resize moved their group
    /// away and back), so that its sequences go on from there. If the store
    /// cannot say, it relearns them from its peers before writing there.
    #[cold]
    fn restore_own_streams(&mut self, now: Now, added: &[ScopeId]) {
        if added.is_empty() || !self.stores_rows {
            return;
        }
        match self.storage.watermarks() {
            Ok(all) => {
                for (scope, origin, wm) in all {
                    if origin != self.id || !added.contains(&scope) {
                        continue;
                    }
                    let Some(s) = self.scopes.get_mut(&scope) else {
                        continue;
                    };
                    let st = s.streams.get_or_default(&origin);
                    if wm.sequence > st.applied.sequence {
                        st.applied = wm;
                        st.known_last = st.known_last.max(wm.sequence);
                        s.set_durable(&origin, wm);
                    }
                }
            }
            Err(_) => {
                for scope in added {
                    self.relearning.insert(scope.clone(), Relearning::default());
                }
                self.settle_relearning(now);
            }
        }
    }

    /// A new deployment (topology or placement reloaded): scopes, members and trees
    /// are recomputed; applied state is kept.
    pub fn handle_view(&mut self, now: Now, deployment: Arc<Deployment>) {
        self.deployment = deployment;
        self.rebuild_scopes(now);
        // Which entries are valid depends on the deployment (policies, tables).
        if let Err(e) = self.reload_location(now) {
            self.events.push_back(Event::LocationRefused(InvalidEntry {
                table: LOCATION_TABLE.into(),
                prefix: Bytes::new(),
                reason: format!("cannot read the location table: {}", crate::Chain(&e)),
            }));
        }
    }

    /// Rebuilds the location metadata from the `_location` rows in storage, checking
    /// each entry against the current deployment. Purges nothing.
    fn reload_location(&mut self, now: Now) -> Result<(), StorageError> {
        let rows = self
            .storage
            .scan_rows(LOCATION_TABLE, b"", None, usize::MAX)?;
        // A new epoch, so that no reader takes a cursor of the old Location (or of
        // this replica's previous life) for one of this.
        let epoch = {
            use std::hash::{Hash, Hasher};
            let mut h = std::hash::DefaultHasher::new();
            (
                self.id.as_str(),
                now.wall_ms,
                now.mono_us,
                self.location.epoch(),
            )
                .hash(&mut h);
            h.finish()
        };
        let mut location = Location::with_epoch(epoch);
        for (key, row) in rows {
            if let LocationChange::Refused(invalid) =
                location.apply_row(&self.deployment, &key, Some(&row))
            {
                self.events.push_back(Event::LocationRefused(invalid));
            }
        }
        self.location = location;
        Ok(())
    }

    #[cold]
    fn reject(&mut self, from: &ReplicaId, reason: Reject) {
        *self.stats.rejected.entry(reason).or_default() += 1;
        self.events.push_back(Event::Rejected {
            from: from.clone(),
            reason,
        });
    }

    /// Counts a frame the driver could not even parse.
    pub fn note_malformed(&mut self, from: &ReplicaId) {
        self.reject(from, Reject::Malformed);
    }

    fn heard_from(&mut self, now: Now, peer: &ReplicaId) {
        if note_heard(&mut self.peers, now, peer) {
            self.recovered(now, peer);
        }
    }

    /// A suspected peer was heard from again.
    #[cold]
    fn recovered(&mut self, now: Now, peer: &ReplicaId) {
        self.events.push_back(Event::PeerRecovered(peer.clone()));
        self.rebuild_scopes(now);
    }

    // ----- inputs -----

    /// A frame arrived from peer `from` (authenticated by the transport).
    pub fn handle_frame(&mut self, now: Now, from: &ReplicaId, frame: Frame) -> Result<(), Error> {
        if !self.peers.contains_key(from) {
            self.reject(from, Reject::UnknownPeer);
            return Ok(());
        }
        self.heard_from(now, from);
        self.stats.frames_received += 1;
        match frame {
            Frame::Mutations(entries) => {
                for e in entries {
                    self.accept(now, from, e)?;
                }
            }
            Frame::Heartbeats(hbs) => self.handle_heartbeats(now, from, hbs)?,
            Frame::GapRequest(g) => self.handle_gap_request(from, g)?,
            Frame::GapFill(g) => self.handle_gap_fill(now, from, g)?,
            Frame::SnapshotRequest { scope } => self.handle_snapshot_request(from, scope),
            Frame::SnapshotChunk(c) => self.handle_snapshot_chunk(now, from, c)?,
        }
        Ok(())
    }

    /// A frame of `bytes` to `to` has left (or was dropped): release its in-flight bytes.
    pub fn handle_sent(&mut self, to: &ReplicaId, bytes: usize) {
        if let Some(p) = self.peers.get_mut(to) {
            p.inflight_bytes = p.inflight_bytes.saturating_sub(bytes);
        }
    }

    /// Timers: heartbeats, heartbeat forwarding, suspicion, gap retries, compaction.
    pub fn handle_timeout(&mut self, now: Now) -> Result<(), Error> {
        if now.mono_us >= self.next_heartbeat_us {
            self.next_heartbeat_us = now.mono_us + self.config.heartbeat_interval_ms * 1_000;
            self.send_heartbeats(now);
        }
        if self
            .forward_heartbeats_at_us
            .is_some_and(|t| now.mono_us >= t)
        {
            self.forward_heartbeats_at_us = None;
            self.forward_heartbeat_news();
        }
        if now.mono_us >= self.next_check_us {
            self.next_check_us = now.mono_us + self.config.gap_retry_ms * 1_000 / 2;
            self.check_peers(now);
            self.retry_gaps(now);
            self.settle_relearning(now);
            self.vouch(now);
        }
        if now.mono_us >= self.next_compaction_us {
            self.next_compaction_us = now.mono_us + self.config.compaction_interval_ms * 1_000;
            self.purge_again_at_us = None;
            let more = self.compact(now)?;
            self.purge_again_at_us = more.then_some(now.mono_us + compaction::PURGE_AGAIN_US);
        } else if self.purge_again_at_us.is_some_and(|t| now.mono_us >= t) {
            let more = self.purge_logs(now)?;
            self.purge_again_at_us = more.then_some(now.mono_us + compaction::PURGE_AGAIN_US);
        }
        Ok(())
    }

    /// How long a member that sent us tree traffic stays an inbound neighbour:
    /// longer than the probe interval, so probes alone keep a cut-off replica fed.
    fn inbound_ttl_us(&self) -> u64 {
        (3 * self.config.heartbeat_interval_ms).max(2 * self.config.probe_interval_ms) * 1_000
    }

    /// Vouches for the origins gone quiet: those whose watermark here is older than
    /// the suspicion timeout (down, or cut off from this replica). A scope's other origins that this
    /// replica *hears* are those whose applied watermarks reached it within the
    /// last two gossip periods (one second by default); an origin's vouched time
    /// rises to the earliest of their last reports, but no later than when this
    /// replica began hearing again one of them that reported more of that
    /// origin's stream than this replica holds durably (`heard_since`; never, for
    /// one heard without a break). So "vouched as of T" means: as of T, no
    /// replica this one has heard since T had applied a write of the origin that
    /// this one lacks. A replica that hears no other origin of the
    /// scope vouches for nothing (an isolated replica is not fresh), nor while a
    /// member it has not suspected has never reported. Recomputed from scratch each
    /// round (and dropped at once when a report shows writes this replica lacks,
    /// in `handle_heartbeats`): a replica heard again after a partition may hold
    /// what this one lacks, and the promise is about the replicas it hears now.
    fn vouch(&mut self, now: Now) {
        let window_us = self.gossip_window_us();
        let quiet_ms = self.config.suspect_after_ms;
        for s in self.scopes.values_mut() {
            if s.vouched.is_none()
                && s.durable_marks
                    .iter()
                    .all(|m| now.wall_ms.saturating_sub(m.timestamp.wall_ms()) <= quiet_ms)
            {
                continue; // every origin heard: nothing to vouch for
            }
            let mut vouched = vec![s.created_floor; s.origin_ids.len()];
            for (i, origin) in s.origin_ids.iter().enumerate() {
                // Only origins gone quiet: a heard one's watermark is fresher than
                // any vouching (and a lost one may take several suspicion rounds to
                // be suspected, when it sat behind other lost ones on the tree).
                let mark = s.durable_marks[i];
                if *origin == self.id
                    || now.wall_ms.saturating_sub(mark.timestamp.wall_ms()) <= quiet_ms
                {
                    continue;
                }
                let mut earliest: Option<Timestamp> = None;
                // No later than when a reporter holding writes we lack was heard
                // again (gap repair fetches them meanwhile).
                let mut cap = Timestamp::MAX;
                let mut vouchable = true;
                for p in s.origins.iter() {
                    if p == origin || *p == self.id {
                        continue;
                    }
                    let at = match heard_report(s, &self.peers, p, now, window_us) {
                        Heard::Lately(at) => at,
                        Heard::NotLately => continue,
                        // Never reported: one not suspected may hold anything.
                        Heard::NeverReported => {
                            vouchable = false;
                            break;
                        }
                    };
                    let theirs = s
                        .applied_by
                        .get(p)
                        .and_then(|r| r.get(origin))
                        .map_or(0, |w| w.sequence);
                    if theirs > mark.sequence {
                        cap = cap.min(s.heard_since.get(p).copied().unwrap_or(Timestamp::ZERO));
                    }
                    earliest = Some(earliest.map_or(at, |e| e.min(at)));
                }
                if let Some(at) = earliest.filter(|_| vouchable) {
                    vouched[i] = vouched[i].max(at.min(cap));
                }
            }
            let unchanged = match &s.vouched {
                Some(v) => **v == *vouched,
                None => vouched.iter().all(|t| *t == Timestamp::ZERO),
            };
            if !unchanged {
                s.vouched = vouched
                    .iter()
                    .any(|t| *t > Timestamp::ZERO)
                    .then(|| vouched.into());
            }
        }
    }

    /// The scope's other origins whose applied watermarks reached this replica
    /// lately (within two gossip periods, not suspected): those it *hears*, whose
    /// reports vouch for origins gone quiet ([`ScopeWatermarks::freshness`]).
    /// For checkers.
    pub fn heard_reporters(&self, scope: &ScopeId, now: Now) -> Vec<(ReplicaId, Timestamp)> {
        let window_us = self.gossip_window_us();
        let Some(s) = self.scopes.get(scope) else {
            return Vec::new();
        };
        s.origins
            .iter()
            .filter(|p| **p != self.id)
            .filter(|p| {
                matches!(
                    heard_report(s, &self.peers, p, now, window_us),
                    Heard::Lately(_)
                )
            })
            .map(|p| {
                let since = s.heard_since.get(p).copied().unwrap_or(Timestamp::ZERO);
                (p.clone(), since)
            })
            .collect()
    }

    /// Two periods of applied-watermark gossip, in microseconds: every member heard
    /// reports within it.
    fn gossip_window_us(&self) -> u64 {
        2 * self.config.applied_gossip_every.max(1) * self.config.heartbeat_interval_ms * 1_000
    }

    fn check_peers(&mut self, now: Now) {
        for s in self.scopes.values_mut() {
            s.inbound.retain(|_, until| *until > now.mono_us);
        }
        let limit_us = self.config.suspect_after_ms * 1_000;
        let silent: Vec<ReplicaId> = self
            .peers
            .iter()
            .filter(|(_, p)| !p.suspected && now.mono_us.saturating_sub(p.last_heard_us) > limit_us)
            .map(|(id, _)| id.clone())
            .collect();
        if silent.is_empty() {
            return;
        }
        // Most peers are heard only through heartbeats relayed along the tree, so
        // when one replica goes quiet, so does everyone behind it. Suspect the quiet
        // peers nearest to us on the global tree only; those behind another quiet one
        // get a new period to be heard over the tree rebuilt without it (suspecting
        // them all at once made every loss of a relay look like the loss of its
        // subtree, and the trees churn). One tree has no cycles, so the nearest
        // quiet peer on each path is always suspected.
        let tree = self
            .scopes
            .get(self.deployment.system_scope())
            .map(|s| &s.tree);
        let behind_quiet = |p: &ReplicaId| {
            tree.and_then(|t| t.path(&self.id, p))
                .is_some_and(|path| path[1..path.len() - 1].iter().any(|q| silent.contains(q)))
        };
        let graced: Vec<Option<u64>> = silent
            .iter()
            .map(|p| behind_quiet(p).then(|| self.regrace_us(p)))
            .collect();
        let mut changed = false;
        for (id, graced) in silent.iter().zip(graced) {
            let Some((last_heard_us, suspected)) = self.peers.liveness_mut(id) else {
                continue;
            };
            if let Some(grace_us) = graced {
                // Suspected in `grace_us` unless heard by then.
                *last_heard_us = (now.mono_us + grace_us).saturating_sub(limit_us);
            } else {
                *suspected = true;
                changed = true;
                self.events.push_back(Event::PeerSuspected(id.clone()));
            }
        }
        if changed {
            self.rebuild_scopes(now);
        }
    }

    /// How long a quiet peer behind another quiet one gets to be heard over the
    /// tree rebuilt without that one ([`Replica::check_peers`]): a round trip to
    /// it and four heartbeat intervals (its neighbours rebuild too, then relay its
    /// next heartbeat), at most a whole suspicion period. Not a whole period each:
    /// the replicas of a lost region, in line behind one another, were suspected
    /// a period apart (31.0, 32.1, 33.2 s in the region-outage drill), and bounded
    /// reads failed until the last was.
    fn regrace_us(&self, peer: &ReplicaId) -> u64 {
        let rtt_ms = self
            .deployment
            .topology
            .rtt_ms(&self.id, peer)
            .unwrap_or(0.0);
        let grace_ms = 4 * self.config.heartbeat_interval_ms + rtt_ms.ceil() as u64;
        grace_ms.min(self.config.suspect_after_ms) * 1_000
    }

    fn retry_gaps(&mut self, now: Now) {
        let snapshot_timeout_us = self.config.suspect_after_ms * 1_000 * 2;
        let mut work = Vec::new();
        let mut work_copy = Vec::new();
        for (scope, s) in &mut self.scopes {
            if let Some(inc) = &s.incoming
                && now.mono_us.saturating_sub(inc.asked_at_us) > snapshot_timeout_us
            {
                // The snapshot stalled (sender gone?): forget it; gap repair will
                // start over and ask someone else.
                s.incoming = None;
            }
            if s.incoming.is_none()
                && let Some(leader) = self.copying.get(scope)
            {
                // A resize's follower still without its copy (its leader had not
                // taken up the new layout yet, or went away): ask again.
                work_copy.push((scope.clone(), leader.clone()));
            }
            for (origin, st) in &s.streams {
                if st.known_last > st.applied.sequence {
                    work.push((scope.clone(), origin.clone()));
                }
            }
        }
        for (scope, leader) in work_copy {
            self.request_snapshot(now, &scope, &leader);
        }
        for (scope, origin) in work {
            self.maybe_request_gap(now, &scope, &origin);
        }
    }

    /// When the driver should call `handle_timeout` next.
    pub fn poll_timeout(&self) -> Option<u64> {
        let mut t = self
            .next_heartbeat_us
            .min(self.next_check_us)
            .min(self.next_compaction_us);
        if let Some(f) = self.forward_heartbeats_at_us {
            t = t.min(f);
        }
        if let Some(p) = self.purge_again_at_us {
            t = t.min(p);
        }
        Some(t)
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The next frame to send: control frames first, then batched mutations, then
    /// snapshot chunks, round-robin over peers, within each peer's in-flight bound.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let n = self.peers.len();
        if n > 0 {
            // Unmarked peers have nothing ready, so the first marked peer with a
            // frame is the first peer with a frame in round-robin order.
            while let Some(i) = self.peers.next_marked(self.next_peer % n) {
                if let Some(t) = self.next_for(i) {
                    self.next_peer = (i + 1) % n;
                    return Some(t);
                }
                self.peers.unmark(i);
            }
        }
        #[cfg(debug_assertions)]
        for (id, p) in self.peers.iter() {
            debug_assert!(
                !p.ready(self.config.inflight_bytes_max),
                "{}: a frame for {id} was queued without `Peers::get_mut`",
                self.id
            );
        }
        None
    }

    /// The next frame for the `i`-th peer (in id order), if it has one ready.
    fn next_for(&mut self, i: usize) -> Option<Transmit> {
        let max_inflight = self.config.inflight_bytes_max;
        let batch_max = self.config.batch_bytes_max;
        let p = self.peers.list.at_mut(i).1;
        let frame = if !p.heartbeats.is_empty() {
            Frame::Heartbeats(std::mem::take(&mut p.heartbeats))
        } else if let Some(f) = p.frames.pop_front() {
            f
        } else if !p.mutations.is_empty() && p.inflight_bytes < max_inflight {
            let mut entries = Vec::new();
            let mut bytes = 0;
            while let Some((_, b)) = p.mutations.front() {
                if !entries.is_empty() && bytes + b > batch_max {
                    break;
                }
                let (e, b) = p.mutations.pop_front().expect("front exists");
                bytes += b;
                p.queued_bytes -= b;
                entries.push(e);
            }
            Frame::Mutations(entries)
        } else if !p.outgoing.is_empty() && p.inflight_bytes < max_inflight {
            let mut o = p.outgoing.pop_front().expect("non-empty");
            let chunk = match self.next_chunk(&mut o) {
                Ok(c) => c,
                Err(_) => return None, // storage trouble: the requester will retry
            };
            let p = self.peers.list.at_mut(i).1;
            if !chunk.last {
                p.outgoing.push_front(o);
            }
            Frame::SnapshotChunk(chunk)
        } else {
            return None;
        };
        let bytes = frame.wire_bytes();
        let (id, p) = self.peers.list.at_mut(i);
        p.inflight_bytes += bytes;
        Some(Transmit {
            to: id.clone(),
            class: frame.class(),
            frame,
            bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A report raised by gossip in any order, with repeats, holds what a map
        /// raised entry by entry would (the report it replaced).
        #[test]
        fn report_raises_as_a_map_would(
            batches in prop::collection::vec(
                prop::collection::vec((0u8..12, 0u64..5, 0u64..5), 0..10), 1..6),
            in_order in any::<bool>(),
        ) {
            let id = |o: u8| ReplicaId::new(format!("r{o}"));
            let mut report = Report::default();
            let mut map: BTreeMap<ReplicaId, Watermark> = BTreeMap::new();
            for batch in batches {
                let mut news: Vec<(ReplicaId, Watermark)> = batch
                    .iter()
                    .map(|&(o, sequence, ts)| {
                        (id(o), Watermark { sequence, timestamp: Timestamp::from_u64(ts) })
                    })
                    .collect();
                if in_order {
                    // As a member gossips: one per origin, in origin order (the walk).
                    news.sort_by(|a, b| a.0.cmp(&b.0));
                    news.dedup_by(|a, b| a.0 == b.0);
                }
                report.raise(&news);
                for (o, w) in &news {
                    let cur = map.entry(o.clone()).or_default();
                    if w.sequence > cur.sequence
                        || (w.sequence == cur.sequence && w.timestamp > cur.timestamp)
                    {
                        *cur = *w;
                    }
                }
                let as_map: Vec<_> = map.iter().map(|(o, w)| (o.clone(), *w)).collect();
                prop_assert_eq!(&report.0, &as_map);
                for o in 0..12 {
                    prop_assert_eq!(report.get(&id(o)), map.get(&id(o)));
                }
            }
        }

        /// `next_marked` finds what a round-robin walk over every position finds,
        /// across word boundaries, after marks, unmarks and list changes.
        #[test]
        fn next_marked_is_the_round_robin_walk(
            n in 0usize..200,
            marks in prop::collection::vec((any::<bool>(), 0usize..200), 0..60),
            start in 0usize..200,
        ) {
            let mut peers = Peers::default();
            for i in 0..n {
                peers.insert_if_absent(&ReplicaId::new(format!("r{i:03}")), Peer::default);
            }
            // Found by address (a clone of the id held) and by name (another `Arc`).
            for i in 0..n {
                let held = peers.list.at_mut(i).0.clone();
                prop_assert_eq!(peers.position(&held), Ok(i));
                prop_assert_eq!(peers.position(&ReplicaId::new(format!("r{i:03}"))), Ok(i));
            }
            prop_assert!(peers.position(&ReplicaId::new("zz")).is_err());
            // Every position is marked after the list changed; clear them, then
            // mark and unmark as drawn.
            for i in 0..n {
                peers.unmark(i);
            }
            let mut want = vec![false; n];
            for (mark, i) in marks {
                if i >= n {
                    continue;
                }
                if mark {
                    let id = peers.list.at_mut(i).0.clone();
                    prop_assert!(peers.get_mut(&id).is_some());
                } else {
                    peers.unmark(i);
                }
                want[i] = mark;
            }
            let from = if n == 0 { 0 } else { start % n };
            let walk = (0..n).map(|k| (from + k) % n).find(|&i| want[i]);
            prop_assert_eq!(peers.next_marked(from), walk);
            peers.mark_all();
            prop_assert_eq!(peers.next_marked(from), (n > 0).then_some(from));
            prop_assert!(peers.marked.iter().map(|w| w.count_ones() as usize).sum::<usize>() == n);
        }
    }
}
