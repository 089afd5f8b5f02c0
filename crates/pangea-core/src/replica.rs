//! The replica state machine: scoped streams, tree forwarding, gap repair, exact
//! watermarks, heartbeats, snapshots and failure suspicion — with no I/O.
//!
//! Shaped like quinn-proto: inputs are `handle_*(now, …)` and [`Replica::propose`];
//! outputs are pulled with [`Replica::poll_transmit`], [`Replica::poll_timeout`] and
//! [`Replica::poll_event`]. Storage goes through [`Storage`]; time arrives as
//! [`Now`]; randomness comes from a seeded generator. The QUIC node and the simulator
//! drive this same code.
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
use pangea_topology::{Deployment, RegionId, Tree};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

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
    /// A gap request unanswered this long is retried with another peer (default 200 ms).
    pub gap_retry_ms: u64,
    /// How long a stream may look behind before a gap request goes out (default
    /// 100 ms): entries still in flight on another path, or queued behind a
    /// heartbeat, usually arrive within it.
    pub gap_grace_ms: u64,
    /// Most entries asked for, or sent, in one gap request (default 512).
    pub gap_entries_max: usize,
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

/// Rows [`Replica::purge_moved_rows`] deleted after one migration's flip.
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
    members: Roster,
    /// Members that store rows and write: the origins.
    origins: Roster,
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
    next_check_us: u64,
    /// Where the compaction sweep resumes: (table, after this key).
    sweep: Option<(Arc<str>, Bytes)>,
    /// Location metadata (the `_location` table): run-time placement overrides.
    location: Location,
    /// Prefixes whose rows a flip moved away from this replica, purged by
    /// [`Replica::purge_moved_rows`] once the driver has published the new location
    /// (so no read sees a purged row under the old placement).
    pending_purges: Vec<(Arc<str>, Bytes, String)>,
    /// Scopes whose own stream this replica is relearning from its peers
    /// ([`Replica::relearn_own_streams`]); it writes in none of them.
    relearning: BTreeMap<ScopeId, Relearning>,
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
            next_check_us: now.mono_us,
            sweep: None,
            location: Location::new(),
            pending_purges: Vec::new(),
            relearning: BTreeMap::new(),
            stats: Stats::default(),
        };
        r.rebuild_scopes(now);
        // Location metadata, as this replica last applied it.
        r.reload_location(now)?;
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
        let entry = self.location.lookup(table, key);
        let ours = if table.starts_with('_') {
            self.scopes
                .contains_key(pangea_topology::placement::GLOBAL_POLICY)
        } else {
            let scope = match entry {
                Some(e) => &e.policy,
                None => self.deployment.scope_of(table, key),
            };
            self.scopes.contains_key(scope)
        };
        ours || entry
            .and_then(|e| e.migrating_to.as_ref())
            .is_some_and(|b| self.scopes.contains_key(b))
    }

    /// Whether every member of `scope` has reported applying `origin`'s stream up to
    /// `sequence` (from the applied-watermark gossip of heartbeats).
    pub fn applied_everywhere(&self, scope: &ScopeId, origin: &ReplicaId, sequence: u64) -> bool {
        let Some(s) = self.scopes.get(scope) else {
            return false;
        };
        s.members.iter().all(|m| {
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
        let d = self.deployment.clone();
        let mine: BTreeSet<ScopeId> = d
            .scopes()
            .filter(|s| d.allowed(&self.id, s))
            .cloned()
            .collect();
        self.scopes.retain(|s, _| mine.contains(s));
        for scope in &mine {
            let members = d.scope_members(scope);
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
            match self.scopes.get_mut(scope) {
                Some(s) => {
                    if s.tree != tree {
                        self.events.push_back(Event::TreeChanged {
                            scope: scope.clone(),
                            edges: tree.edges.len(),
                        });
                    }
                    s.tree = tree;
                    s.members = members.into();
                    if !s.origins.is(&origins) {
                        s.origins = origins.into();
                        s.refresh_origins();
                    }
                }
                None => {
                    self.scopes.insert(
                        scope.clone(),
                        ScopeState {
                            members: members.into(),
                            origin_ids: origins.iter().cloned().collect(),
                            durable_marks: vec![Watermark::default(); origins.len()],
                            origins: origins.into(),
                            tree,
                            streams: IdMap::default(),
                            applied_by: BTreeMap::new(),
                            reported_at: BTreeMap::new(),
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
                reason: format!("cannot read the location table: {e}"),
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

    // ----- local writes -----

    /// Applies a local write: the next sequence of its (scope, self) stream and a new
    /// HLC timestamp. The returned token is valid at once for reads here, but the
    /// write is durable — and may be acknowledged to the client — only after
    /// [`Replica::flush`] emits [`Event::Committed`] for it.
    pub fn propose(&mut self, now: Now, mutation: RowMutation) -> Result<Token, Error> {
        mutation.check_schema(&self.deployment.placement.schema)?;
        if &**mutation.table() == LOCATION_TABLE {
            crate::location::check_location_write(&mutation, &self.deployment)?;
        }
        self.check_row_size(&mutation)?;
        let scope = self.scope_of(mutation.table(), mutation.row_key());
        // During a migration writes go to both policies' streams, so only a replica
        // of both may take them (no write can slip past the backfill).
        let also = self
            .location
            .migrating_to(mutation.table(), mutation.row_key())
            .cloned();
        if let Some(b) = also.filter(|b| b != &scope) {
            if !self.scopes.contains_key(&b) {
                return Err(Error::PolicyForbids {
                    scope: format!("{scope} (migrating to {b})"),
                    replica: self.id.to_string(),
                });
            }
            self.append_local(now, &b, mutation.clone())?;
        }
        self.append_local(now, &scope, mutation)
    }

    /// Refuses a write that would take its row past [`Limits::row_bytes_max`]
    /// (`Error::TooLarge` naming the row's size after it and the limit). Only
    /// writes that add cells can; the row is read only when the sum of what it
    /// holds and what the write adds exceeds the limit, and then the write is
    /// applied to a copy (as the newest version, so it replaces what it would) and
    /// the copy measured.
    fn check_row_size(&self, m: &RowMutation) -> Result<(), Error> {
        let adds = |x: &Mutation| matches!(x, Mutation::SetCell { .. } | Mutation::MergeRow(_));
        if !m.mutations().iter().any(adds) {
            return Ok(());
        }
        let max = self.config.limits.row_bytes_max;
        let (table, key) = (m.table(), m.row_key());
        let added = m.payload_bytes() - key.len();
        if added.saturating_add(self.storage.row_value_bytes(table, key)?) <= max {
            return Ok(());
        }
        let mut row = self.storage.get_row(table, key)?.unwrap_or_default();
        let version = Version::new(Timestamp::MAX, self.id.clone());
        let schema = self.deployment.placement.schema.table(table);
        row.apply(&version, m.mutations(), schema);
        Limits::check(Limited::Row, row.value_bytes(), max)
    }

    /// A local write into one given scope's stream: the row's own scope, or the
    /// scope a migration moves it to (backfill writes there only).
    pub fn propose_in(
        &mut self,
        now: Now,
        scope: &ScopeId,
        mutation: RowMutation,
    ) -> Result<Token, Error> {
        mutation.check_schema(&self.deployment.placement.schema)?;
        if &**mutation.table() == LOCATION_TABLE {
            crate::location::check_location_write(&mutation, &self.deployment)?;
        }
        self.check_row_size(&mutation)?;
        let (table, key) = (mutation.table(), mutation.row_key());
        let allowed = self.scope_of(table, key) == *scope
            || self.location.migrating_to(table, key) == Some(scope);
        if !allowed {
            return Err(Error::PolicyForbids {
                scope: scope.to_string(),
                replica: self.id.to_string(),
            });
        }
        self.append_local(now, scope, mutation)
    }

    /// `Some` when this replica's clock is fenced: more than half of the origins it
    /// heard from in the last [`CLOCK_FENCE_WINDOW_US`] (at least two of them) stamp
    /// heartbeats more than `max_offset` *ahead* of its own clock (each peer's
    /// freshest reading in the window: see `PeerClock`). Its clock is then the odd
    /// one out, far behind, and [`Replica::propose`] refuses writes with this error:
    /// stamped in everyone else's past, they would lose to older writes. A clock far
    /// *ahead* is not fenced here (late heartbeats would look the same); its peers
    /// refuse its timestamps instead (I1), so its writes wait until real time reaches
    /// them. With a single peer heard nobody can tell which clock is wrong: no fence.
    pub fn clock_fence(&self, now: Now) -> Option<ClockError> {
        let max = self.clock.max_offset_ms();
        let mut heard = 0usize;
        let mut off: Vec<i64> = Vec::new();
        for c in self.peer_clocks.values() {
            let Some(offset_ms) = c.offset(now.mono_us) else {
                continue;
            };
            heard += 1;
            // Only peers reading *ahead*: lateness can make a peer read behind, never
            // ahead, so this direction is never a false alarm. (A clock far ahead
            // is handled by its peers, which refuse its timestamps: I1.)
            if offset_ms > 0 && offset_ms.unsigned_abs() > max {
                off.push(offset_ms);
            }
        }
        if heard < 2 || off.len() * 2 <= heard {
            return None;
        }
        off.sort_unstable();
        Some(ClockError::Fenced {
            offset_ms: -off[off.len() / 2],
            peers_off: off.len(),
            peers_heard: heard,
            window_s: CLOCK_FENCE_WINDOW_US / 1_000_000,
            max_offset_ms: max,
        })
    }

    fn append_local(
        &mut self,
        now: Now,
        scope: &ScopeId,
        mutation: RowMutation,
    ) -> Result<Token, Error> {
        if let Some(fence) = self.clock_fence(now) {
            return Err(Error::Clock(fence));
        }
        if !self.stores_rows || !self.scopes.contains_key(scope) {
            return Err(Error::PolicyForbids {
                scope: scope.to_string(),
                replica: self.id.to_string(),
            });
        }
        if self.relearning.contains_key(scope) {
            return Err(Error::OwnStreamUnknown {
                scope: scope.to_string(),
                replica: self.id.to_string(),
            });
        }
        let timestamp = self.clock.now(now.wall_ms);
        let sequence = self.stream_mut(scope, &self.id.clone()).applied.sequence + 1;
        let entry = LogEntry {
            scope: scope.clone(),
            origin: self.id.clone(),
            sequence,
            timestamp,
            mutation,
        };
        self.apply_entry(now, &entry)?;
        self.unflushed.push(entry);
        Ok(Token {
            scope: scope.clone(),
            origin: self.id.clone(),
            sequence,
            timestamp,
        })
    }

    /// Makes everything applied so far durable (one `Storage::sync`), then
    /// acknowledges and sends local writes and advertises the new watermarks.
    pub fn flush(&mut self, now: Now) -> Result<(), Error> {
        // Heartbeat-advanced watermark timestamps go to storage first (I6: an
        // advertised watermark never goes backwards, across restarts too).
        // In scope order, then origin order, as a walk over every stream would go.
        // One walk: each moved stream's dirty watermark joins the batch, and what it
        // has applied is taken as durable at once (noted in `advanced`); the events
        // follow the sync. If the write or the sync fails, `unflush` puts the
        // streams back.
        self.moved.sort_unstable();
        let mut batch = WriteBatch::default();
        let mut advanced = std::mem::take(&mut self.advanced);
        for (i, (scope, origin)) in self.moved.iter().enumerate() {
            let Some(s) = self.scopes.get_mut(scope) else {
                continue;
            };
            let Some(st) = s.streams.get_mut(origin) else {
                continue;
            };
            if st.dirty {
                batch
                    .watermarks
                    .push((scope.clone(), origin.clone(), st.applied));
                st.dirty = false;
            }
            st.listed = false;
            if st.durable != st.applied {
                let wm = st.applied;
                advanced.push((i, st.durable, wm));
                st.durable = wm;
                set_mark(&s.origins, &mut s.durable_marks, origin, wm);
            }
        }
        let written = if batch.is_empty() {
            Ok(())
        } else {
            self.storage.write(batch)
        }
        .and_then(|()| self.storage.sync());
        if let Err(e) = written {
            self.unflush(&advanced);
            advanced.clear();
            self.advanced = advanced;
            return Err(e.into());
        }
        let mut next = advanced.iter().peekable();
        for (i, (scope, origin)) in self.moved.drain(..).enumerate() {
            if let Some((_, _, wm)) = next.next_if(|(j, _, _)| *j == i) {
                self.events.push_back(Event::WatermarkAdvanced {
                    scope,
                    origin,
                    watermark: *wm,
                });
            }
        }
        advanced.clear();
        self.advanced = advanced;
        #[cfg(debug_assertions)]
        for s in self.scopes.values() {
            for (origin, st) in &s.streams {
                debug_assert!(
                    !st.dirty && st.durable == st.applied && !st.listed,
                    "{}: the stream of {origin} moved without being listed for flush",
                    self.id
                );
            }
        }
        for entry in std::mem::take(&mut self.unflushed) {
            self.events.push_back(Event::Committed(Token {
                scope: entry.scope.clone(),
                origin: entry.origin.clone(),
                sequence: entry.sequence,
                timestamp: entry.timestamp,
            }));
            self.forward(now, &entry, None);
        }
        Ok(())
    }

    /// Undoes a flush whose write or sync failed: the moved streams stay listed
    /// for the next flush, and their durable watermarks go back (`advanced`: the
    /// position in `moved`, the durable watermark before, the one taken).
    #[cold]
    fn unflush(&mut self, advanced: &[(usize, Watermark, Watermark)]) {
        for (scope, origin) in &self.moved {
            if let Some(st) = stream_of(&mut self.scopes, scope, origin) {
                st.listed = true;
            }
        }
        for (i, before, _) in advanced {
            let (scope, origin) = &self.moved[*i];
            if let Some(s) = self.scopes.get_mut(scope) {
                s.set_durable(origin, *before);
            }
        }
    }

    // ----- applying entries -----

    /// Applies one entry in stream order: row change, log entry and watermark in one
    /// atomic write (I2).
    fn apply_entry(&mut self, now: Now, e: &LogEntry) -> Result<(), StorageError> {
        let d = self.deployment.clone();
        let holds_row = self.stores_rows && self.may_hold(e.mutation.table(), e.mutation.row_key());
        let Some(s) = self.scopes.get(&e.scope) else {
            return Ok(());
        };
        let horizon = s.purge_horizon;
        let applied = s.streams.get(&e.origin).map(|st| st.applied);
        let wm = Watermark {
            sequence: e.sequence,
            timestamp: e.timestamp.max(applied.unwrap_or_default().timestamp),
        };
        let is_location = &**e.mutation.table() == LOCATION_TABLE;
        let mut location_row = None;
        if holds_row {
            let a = RowApply {
                entry: e,
                compaction: Compaction {
                    deployment: &d,
                    horizon,
                    now_ms: now.wall_ms,
                },
            };
            self.storage.apply_entry_to_row(&a, wm)?;
            if is_location {
                let (table, key) = (e.mutation.table(), e.mutation.row_key());
                location_row = self.storage.get_row(table, key)?;
            }
        } else {
            self.storage.append_entry(e, wm)?;
        }
        let st = self
            .scopes
            .get_mut(&e.scope)
            .expect("looked up above")
            .streams
            .get_or_default(&e.origin);
        st.applied = wm;
        st.dirty = false;
        st.known_last = st.known_last.max(e.sequence);
        // A heartbeat seen earlier may now apply.
        if st.heartbeat.0 <= wm.sequence && st.heartbeat.1 > st.applied.timestamp {
            st.applied.timestamp = st.heartbeat.1;
            st.dirty = true;
        }
        list_moved(&mut self.moved, st, &e.scope, &e.origin);
        self.stats.applied += 1;
        self.events.push_back(Event::Applied {
            scope: e.scope.clone(),
            origin: e.origin.clone(),
            sequence: e.sequence,
            timestamp: e.timestamp,
        });
        if is_location {
            self.location_changed(e.mutation.row_key(), location_row.as_ref())?;
        }
        Ok(())
    }

    /// A `_location` row changed: update the location table (a valid entry only),
    /// and if rows under its prefix may no longer live here because a migration
    /// flipped them away, purge them from this replica's store (I10). The purge is
    /// local: the rows live on in the replicas their policy allows. Only the flip of
    /// a job whose `_jobs` row says it finished its backfill to exactly that policy
    /// purges; any other entry that excludes this replica leaves the rows in place.
    fn location_changed(
        &mut self,
        key: &Bytes,
        row: Option<&RowState>,
    ) -> Result<(), StorageError> {
        let entry = match self.location.apply_row(&self.deployment, key, row) {
            LocationChange::InForce(entry) => entry,
            LocationChange::Removed => return Ok(()),
            LocationChange::Refused(invalid) => {
                self.events.push_back(Event::LocationRefused(invalid));
                return Ok(());
            }
        };
        if !self.stores_rows || self.may_hold(&entry.table, &entry.prefix) {
            return Ok(());
        }
        let job_key = Bytes::from(entry.job_id.clone().into_bytes());
        let job = self
            .storage
            .get_row(JOBS_TABLE, &job_key)?
            .and_then(|row| crate::location::decode_job(&job_key, &row));
        if job.is_some_and(|job| entry.is_flip_of(&job)) {
            self.pending_purges
                .push((entry.table, entry.prefix, entry.job_id));
        } else {
            self.events.push_back(Event::PurgeWithheld {
                table: entry.table,
                prefix: entry.prefix,
                policy: entry.policy,
            });
        }
        Ok(())
    }

    /// Deletes, from this replica's store only, the rows a placement flip moved to a
    /// policy that excludes this replica (I10). Drivers call it after publishing the
    /// new location metadata to their serving path; the rows live on at the replicas
    /// their policy allows. Returns what was purged: per flipped (table, prefix),
    /// the migration job and the number of rows.
    pub fn purge_moved_rows(&mut self) -> Result<Vec<Purged>, StorageError> {
        let mut done = Vec::new();
        for (table, prefix, job_id) in std::mem::take(&mut self.pending_purges) {
            let mut purged = 0;
            let mut after: Option<Bytes> = None;
            loop {
                let rows = self
                    .storage
                    .scan_rows(&table, &prefix, after.as_deref(), 1_000)?;
                let Some((last, _)) = rows.last() else { break };
                after = Some(last.clone());
                let mut batch = WriteBatch::default();
                for (key, _) in rows {
                    // Only rows this entry governs (a longer prefix may say otherwise).
                    if !self.may_hold(&table, &key) {
                        batch.rows.push(RowWrite {
                            table: table.clone(),
                            key,
                            row: None,
                        });
                    }
                }
                purged += batch.rows.len() as u64;
                if !batch.rows.is_empty() {
                    self.storage.write(batch)?;
                }
            }
            done.push(Purged {
                table,
                prefix,
                job_id,
                rows: purged,
            });
        }
        Ok(done)
    }

    /// Accepts an entry from `from`: applies it if next in line, buffers it if early,
    /// drops it if old. Forwards what it applies.
    fn accept(&mut self, now: Now, from: &ReplicaId, e: LogEntry) -> Result<(), Error> {
        let Some(s) = self.scopes.get(&e.scope) else {
            self.reject(from, Reject::UnknownScope);
            return Ok(());
        };
        if !s.origins.contains(&e.origin) || !s.members.contains(from) {
            self.reject(from, Reject::NotInScope);
            return Ok(());
        }
        let s = &self.scopes[&e.scope];
        // Copy the watermark only: cloning the whole stream (with its buffer of up to
        // `reorder_window` out-of-order entries) for every entry made catching up
        // quadratic; a replica restarted behind a busy origin spent over a minute of
        // CPU in here, unable to heartbeat (pangea-cli/tests/node_process.rs).
        let applied = s
            .streams
            .get(&e.origin)
            .map(|st| st.applied)
            .unwrap_or_default();
        if e.sequence <= applied.sequence {
            self.stats.duplicates += 1;
            return Ok(());
        }
        if e.origin == self.id && !self.relearning.contains_key(&e.scope) {
            // We never lose our own durable writes; something claims to be ours.
            self.reject(from, Reject::ForeignOwnSequence);
            return Ok(());
        }
        if e.sequence > applied.sequence + self.config.reorder_window {
            self.reject(from, Reject::SequenceTooFarAhead);
            let st = self.stream_mut(&e.scope, &e.origin);
            st.known_last = st.known_last.max(st.applied.sequence + 1);
            st.hint = Some(from.clone());
            self.maybe_request_gap(now, &e.scope.clone(), &e.origin.clone());
            return Ok(());
        }
        if let Err(err) = self.clock.observe(now.wall_ms, e.timestamp) {
            let _ = err;
            self.reject(from, Reject::TimestampAhead);
            return Ok(());
        }
        let (scope, origin) = (e.scope.clone(), e.origin.clone());
        if e.sequence == applied.sequence + 1 {
            self.apply_entry(now, &e)?;
            self.forward(now, &e, Some(from));
            self.drain_pending(now, &scope, &origin)?;
        } else {
            let st = self.stream_mut(&scope, &origin);
            st.known_last = st.known_last.max(e.sequence);
            st.hint = Some(from.clone());
            if st.pending.insert(e.sequence, (e, from.clone())).is_none() {
                self.stats.buffered += 1;
            }
            self.maybe_request_gap(now, &scope, &origin);
        }
        Ok(())
    }

    fn stream_mut(&mut self, scope: &ScopeId, origin: &ReplicaId) -> &mut Stream {
        self.scopes
            .get_mut(scope)
            .expect("callers checked the scope exists")
            .streams
            .get_or_default(origin)
    }

    /// Applies buffered entries that have become next in line.
    fn drain_pending(
        &mut self,
        now: Now,
        scope: &ScopeId,
        origin: &ReplicaId,
    ) -> Result<(), Error> {
        loop {
            let st = self.stream_mut(scope, origin);
            let next = st.applied.sequence + 1;
            // Entries at or below the watermark (e.g. after a snapshot) are stale.
            while st.pending.first_key_value().is_some_and(|(s, _)| *s < next) {
                st.pending.pop_first();
            }
            let Some((e, from)) = st.pending.remove(&next) else {
                // Nothing more in line: caught up, or still missing something.
                if st.known_last <= st.applied.sequence {
                    st.gap = None;
                    st.behind_since_us = None;
                    return Ok(());
                }
                break;
            };
            self.apply_entry(now, &e)?;
            self.forward(now, &e, Some(&from));
        }
        self.maybe_request_gap(now, scope, origin);
        Ok(())
    }

    /// Queues `e` for every tree neighbour but `except`.
    fn forward(&mut self, _now: Now, e: &LogEntry, except: Option<&ReplicaId>) {
        let Some(s) = self.scopes.get(&e.scope) else {
            return;
        };
        let bytes = e.wire_bytes();
        for n in s.forward_set(&self.id).filter(|n| Some(*n) != except) {
            // Residency (principle 5): never toward a replica outside the scope.
            if !s.members.contains(n) {
                continue;
            }
            let Some(p) = self.peers.get_mut(n) else {
                continue;
            };
            if p.queued_bytes + bytes > self.config.queued_bytes_max {
                // Gap repair will fetch it when the peer catches up.
                self.stats.dropped_queue_full += 1;
                continue;
            }
            p.queued_bytes += bytes;
            p.mutations.push_back((e.clone(), bytes));
        }
    }

    // ----- gap repair -----

    /// Asks a peer for the missing part of a stream, unless a request is in flight.
    fn maybe_request_gap(&mut self, now: Now, scope: &ScopeId, origin: &ReplicaId) {
        let retry_us = self.config.gap_retry_ms * 1_000;
        let gap_max = self.config.gap_entries_max as u64;
        let Some(s) = self.scopes.get(scope) else {
            return;
        };
        if s.incoming.is_some() {
            return; // a snapshot is on its way
        }
        let Some(st) = s.streams.get(origin) else {
            return;
        };
        let from = st.applied.sequence + 1;
        let first_pending = st.pending.keys().next().copied();
        let last = match first_pending {
            Some(p) => p - 1,
            None => st.known_last,
        };
        if last < from {
            return;
        }
        let grace_us = self.config.gap_grace_ms * 1_000;
        match st.behind_since_us {
            None => {
                self.stream_mut(scope, origin).behind_since_us = Some(now.mono_us);
                return;
            }
            Some(t) if st.gap.is_none() && now.mono_us < t + grace_us => return,
            Some(_) => {}
        }
        let attempt = match &st.gap {
            // Wait at least two round trips to the peer asked before asking another.
            Some(g) if now.mono_us < g.at_us + retry_us.max(2 * self.rtt_us(&g.asked)) => return,
            Some(g) => g.attempt + 1,
            None => 0,
        };
        // Candidates: the hint (it sent us something later, so it applied this), tree
        // neighbours, the origin, then any live member that stores the scope.
        let mut candidates: Vec<ReplicaId> = Vec::new();
        candidates.extend(st.hint.iter().cloned());
        candidates.extend(s.forward_set(&self.id).cloned());
        candidates.push(origin.clone());
        candidates.extend(s.members.iter().cloned());
        let mut seen = BTreeSet::new();
        candidates.retain(|c| {
            *c != self.id
                && seen.insert(c.clone())
                && !self.peers.get(c).is_some_and(|p| p.suspected)
        });
        if candidates.is_empty() {
            return;
        }
        let asked = candidates[attempt as usize % candidates.len()].clone();
        let to = last.min(from + gap_max - 1);
        let st = self.stream_mut(scope, origin);
        st.gap = Some(GapInFlight {
            asked: asked.clone(),
            at_us: now.mono_us,
            attempt,
        });
        self.stats.gap_requests += 1;
        self.events.push_back(Event::GapDetected {
            scope: scope.clone(),
            origin: origin.clone(),
            from,
            to,
        });
        self.queue_frame(
            &asked,
            Frame::GapRequest(GapRequest {
                scope: scope.clone(),
                origin: origin.clone(),
                from,
                to,
            }),
        );
    }

    /// The topology's round-trip estimate to a peer.
    fn rtt_us(&self, peer: &ReplicaId) -> u64 {
        (self
            .deployment
            .topology
            .rtt_ms(&self.id, peer)
            .unwrap_or(0.0)
            * 1_000.0) as u64
    }

    fn queue_frame(&mut self, to: &ReplicaId, frame: Frame) {
        if let Some(p) = self.peers.get_mut(to) {
            p.frames.push_back(frame);
        }
    }

    #[cold]
    fn handle_gap_request(&mut self, from: &ReplicaId, g: GapRequest) -> Result<(), Error> {
        let Some(s) = self.scopes.get(&g.scope) else {
            self.reject(from, Reject::UnknownScope);
            return Ok(());
        };
        if !s.members.contains(from) {
            self.reject(from, Reject::NotInScope);
            return Ok(());
        }
        // Only the watermarks (cloning the stream would copy its reorder buffer).
        let (applied, durable) = s
            .streams
            .get(&g.origin)
            .map(|st| (st.applied, st.durable))
            .unwrap_or_default();
        // Our own writes leave only once durable; others' as soon as applied.
        let upto = if g.origin == self.id {
            durable.sequence
        } else {
            applied.sequence
        };
        let to = g.to.min(upto);
        let entries = if to >= g.from {
            let n = ((to - g.from + 1) as usize).min(self.config.gap_entries_max);
            self.storage.read_log(&g.scope, &g.origin, g.from, n)?
        } else {
            Vec::new()
        };
        let log_start = match self.storage.log_bounds(&g.scope, &g.origin)? {
            Some((first, _)) => first,
            // No log at all: everything up to our watermark is gone from it.
            None => applied.sequence + 1,
        };
        self.queue_frame(
            from,
            Frame::GapFill(GapFill {
                scope: g.scope,
                origin: g.origin,
                entries,
                log_start,
            }),
        );
        Ok(())
    }

    #[cold]
    fn handle_gap_fill(&mut self, now: Now, from: &ReplicaId, g: GapFill) -> Result<(), Error> {
        if !self.scopes.contains_key(&g.scope) {
            self.reject(from, Reject::UnknownScope);
            return Ok(());
        }
        let (scope, origin) = (g.scope.clone(), g.origin.clone());
        let wanted = self.scopes[&scope]
            .streams
            .get(&origin)
            .map_or(1, |st| st.applied.sequence + 1);
        let filled = g.entries.iter().any(|e| e.sequence == wanted);
        for e in g.entries {
            self.accept(now, from, e)?;
        }
        let stores_rows = self
            .deployment
            .topology
            .replicas
            .get(from)
            .is_some_and(|r| r.role.stores_rows());
        if !filled && g.log_start > wanted && stores_rows {
            // The peer no longer has what we miss — whether or not it is the peer we
            // are waiting on now (a slow answer still tells the truth): take a
            // snapshot from it.
            self.stream_mut(&scope, &origin).gap = None;
            self.request_snapshot(now, &scope, from);
            return self.drain_pending(now, &scope, &origin);
        }
        let st = self.stream_mut(&scope, &origin);
        if st.gap.as_ref().is_some_and(|gap| &gap.asked == from) {
            let attempt = st.gap.as_ref().map_or(0, |gap| gap.attempt);
            st.gap = None;
            if !filled {
                // It did not have it yet; try someone else soon.
                // Half the retry delay, not zero: late answers from several peers
                // must not each fire a new request at once.
                let soon_us = now.mono_us.saturating_sub(self.config.gap_retry_ms * 500);
                let st = self.stream_mut(&scope, &origin);
                st.gap = Some(GapInFlight {
                    asked: from.clone(),
                    at_us: soon_us,
                    attempt,
                });
            }
        }
        self.drain_pending(now, &scope, &origin)
    }

    // ----- snapshots -----

    #[cold]
    fn request_snapshot(&mut self, now: Now, scope: &ScopeId, from: &ReplicaId) {
        let Some(s) = self.scopes.get_mut(scope) else {
            return;
        };
        if s.incoming.is_some() {
            return;
        }
        s.incoming = Some(Incoming {
            from: from.clone(),
            snapshot_id: None,
            next_index: 0,
            rows: 0,
            asked_at_us: now.mono_us,
        });
        self.events.push_back(Event::SnapshotNeeded {
            scope: scope.clone(),
            from: from.clone(),
        });
        self.queue_frame(
            from,
            Frame::SnapshotRequest {
                scope: scope.clone(),
            },
        );
    }

    #[cold]
    fn handle_snapshot_request(&mut self, from: &ReplicaId, scope: ScopeId) {
        let Some(s) = self.scopes.get(&scope) else {
            self.reject(from, Reject::UnknownScope);
            return;
        };
        if !s.members.contains(from) {
            self.reject(from, Reject::NotInScope);
            return;
        }
        if !self.stores_rows {
            return; // relays hold no rows; the requester will time out and ask elsewhere
        }
        // The snapshot's rows are read over time while writes continue; every row
        // includes at least what these watermarks cover, and rows merge as CRDTs, so
        // a fuzzy snapshot plus the stream from these watermarks on converges (I9).
        let watermarks: Vec<(ReplicaId, Watermark)> = s.durable_watermarks().collect();
        let tables: VecDeque<Arc<str>> = self
            .deployment
            .placement
            .schema
            .tables
            .keys()
            .cloned()
            .collect();
        let snapshot_id = self.rng.next_u64();
        self.stats.snapshots_sent += 1;
        if let Some(p) = self.peers.get_mut(from) {
            p.outgoing.retain(|o| o.scope != scope);
            p.outgoing.push_back(Outgoing {
                scope,
                snapshot_id,
                index: 0,
                watermarks,
                tables,
                after: None,
                parts: VecDeque::new(),
            });
        }
    }

    /// The next chunk of an outgoing snapshot, reading rows as it goes. A chunk
    /// holds rows of one table, at most `snapshot_chunk_bytes_max` of them (about:
    /// keys and 64 bytes a row are counted besides [`RowState::value_bytes`]), and
    /// a row larger than that goes in parts, one chunk each, that the receiver's
    /// merge puts back together.
    #[cold]
    fn next_chunk(&mut self, o: &mut Outgoing) -> Result<SnapshotChunk, StorageError> {
        const SCAN_ROWS: usize = 256;
        let max = self.config.snapshot_chunk_bytes_max;
        let d = self.deployment.clone();
        let mut rows = Vec::new();
        let mut bytes = 0;
        let mut table: Option<Arc<str>> = None;
        if let Some(part) = o.parts.pop_front() {
            rows.push(part);
            table = o.tables.front().cloned();
            bytes = max; // a part is a chunk of its own
        }
        let mut full = false;
        while bytes < max && !full {
            let Some(current) = o.tables.front().cloned() else {
                break;
            };
            if table.as_ref().is_some_and(|t| *t != current) {
                break;
            }
            let batch = self
                .storage
                .scan_rows(&current, b"", o.after.as_deref(), SCAN_ROWS)?;
            if batch.is_empty() {
                o.tables.pop_front();
                o.after = None;
                continue;
            }
            for (key, row) in batch {
                let size = key.len() + row.value_bytes() + 64;
                // A row that would take the chunk past its size waits for the next.
                if !rows.is_empty() && bytes + size > max {
                    full = true;
                    break;
                }
                o.after = Some(key.clone());
                if self.location.scope_of(&d, &current, &key) != o.scope {
                    continue;
                }
                table = Some(current.clone());
                if size > max {
                    let mut parts = row.split(max.saturating_sub(key.len() + 64));
                    let first = parts.remove(0);
                    self.stats.snapshot_rows_split += 1;
                    o.parts = parts.into_iter().map(|p| (key.clone(), p)).collect();
                    rows.push((key, first));
                    full = true;
                    break;
                }
                bytes += size;
                rows.push((key, row));
                if bytes >= max {
                    break;
                }
            }
        }
        // Last only once every table is exhausted (a later call finds none left).
        let last = o.tables.is_empty();
        let chunk = SnapshotChunk {
            scope: o.scope.clone(),
            snapshot_id: o.snapshot_id,
            index: o.index,
            table: table.unwrap_or_else(|| Arc::from("")),
            rows,
            watermarks: if last {
                o.watermarks.clone()
            } else {
                Vec::new()
            },
            last,
        };
        o.index += 1;
        Ok(chunk)
    }

    #[cold]
    fn handle_snapshot_chunk(
        &mut self,
        now: Now,
        from: &ReplicaId,
        c: SnapshotChunk,
    ) -> Result<(), Error> {
        let d = self.deployment.clone();
        let Some(s) = self.scopes.get_mut(&c.scope) else {
            self.reject(from, Reject::UnknownScope);
            return Ok(());
        };
        let Some(inc) = s.incoming.as_mut() else {
            return Ok(());
        };
        if &inc.from != from
            || inc.snapshot_id.is_some_and(|id| id != c.snapshot_id)
            || c.index != inc.next_index
        {
            return Ok(()); // a stale or out-of-order snapshot: ignore
        }
        inc.snapshot_id = Some(c.snapshot_id);
        inc.next_index += 1;
        inc.asked_at_us = now.mono_us;
        inc.rows += c.rows.len() as u64;
        let horizon = s.purge_horizon;
        let mut batch = WriteBatch::default();
        if self.stores_rows && !c.rows.is_empty() {
            let table = d.placement.schema.table(&c.table);
            for (key, incoming) in c.rows {
                // Residency: a row of another scope has no business here.
                if self.location.scope_of(&d, &c.table, &key) != c.scope {
                    self.reject(from, Reject::NotInScope);
                    continue;
                }
                let mut row = self.storage.get_row(&c.table, &key)?.unwrap_or_default();
                row.merge(&incoming, table);
                row.compact(table, horizon, now.wall_ms);
                batch.rows.push(RowWrite {
                    table: c.table.clone(),
                    key,
                    row: (!row.is_empty()).then_some(row),
                });
            }
        }
        if c.last {
            let s = self.scopes.get_mut(&c.scope).expect("checked above");
            let rows = s.incoming.take().map_or(0, |i| i.rows);
            for (origin, wm) in &c.watermarks {
                if !s.origins.contains(origin) {
                    continue;
                }
                let st = s.streams.get_or_default(origin);
                if wm.sequence > st.applied.sequence
                    || (wm.sequence == st.applied.sequence && wm.timestamp > st.applied.timestamp)
                {
                    st.applied = *wm;
                    st.known_last = st.known_last.max(wm.sequence);
                    list_moved(&mut self.moved, st, &c.scope, origin);
                    batch
                        .watermarks
                        .push((c.scope.clone(), origin.clone(), *wm));
                }
            }
            self.storage.write(batch)?;
            self.stats.snapshots_installed += 1;
            self.events.push_back(Event::SnapshotInstalled {
                scope: c.scope.clone(),
                rows,
            });
            let origins: Vec<ReplicaId> = self.scopes[&c.scope].origins.iter().cloned().collect();
            let relearning = self.relearning.contains_key(&c.scope);
            for origin in origins {
                if origin != self.id || relearning {
                    self.stream_mut(&c.scope, &origin).gap = None;
                    self.drain_pending(now, &c.scope, &origin)?;
                }
            }
        } else if !batch.is_empty() {
            self.storage.write(batch)?;
        }
        Ok(())
    }

    // ----- heartbeats -----

    fn own_heartbeat(&mut self, now: Now, scope: &ScopeId) -> Option<Heartbeat> {
        let periodic = self
            .heartbeats_sent
            .is_multiple_of(self.config.applied_gossip_every.max(1));
        let gossip = self.answer_report_requests(scope) || periodic;
        // The promise: nothing after `durable` will carry a timestamp at or below
        // this. Unflushed local writes (not yet sent) already have timestamps, so
        // promise only below the first of them (I7).
        let first_unflushed = self
            .unflushed
            .iter()
            .filter(|e| &e.scope == scope)
            .map(|e| e.timestamp)
            .min();
        let relearning = self.relearning.contains_key(scope);
        let timestamp = match first_unflushed {
            Some(t) => Timestamp::from_u64(t.as_u64().saturating_sub(1)),
            // Relearning, we do not know what our stream holds: promise nothing
            // beyond what we hold.
            None if relearning => self
                .scopes
                .get(scope)
                .and_then(|s| s.streams.get(&self.id))
                .map_or(Timestamp::ZERO, |st| st.durable.timestamp),
            None => self.clock.now(now.wall_ms),
        };
        // Our own watermark moves with our promise: we have applied all our writes,
        // and none will come at or below it. Written at the next flush (I6).
        if self.stores_rows && !relearning {
            let id = self.id.clone();
            if let Some(st) = self
                .scopes
                .get_mut(scope)
                .map(|s| s.streams.get_or_default(&id))
                && timestamp > st.applied.timestamp
            {
                st.applied.timestamp = timestamp;
                st.dirty = true;
                list_moved(&mut self.moved, st, scope, &self.id);
            }
        }
        let s = self.scopes.get(scope)?;
        let own = s
            .streams
            .get(&self.id)
            .map(|st| st.durable)
            .unwrap_or_default();
        let applied = if gossip {
            // Per origin the sequence applied, and one time for all: the scope's
            // low watermark. Receivers read a report's times only for the purge
            // horizon, a minimum over every entry, so it means what the entries'
            // own times would, and condenses to one number (`crate::link`).
            let low = s
                .durable_marks
                .iter()
                .map(|w| w.timestamp)
                .min()
                .unwrap_or_default();
            s.durable_watermarks()
                .map(|(o, w)| {
                    (
                        o,
                        Watermark {
                            sequence: w.sequence,
                            timestamp: low,
                        },
                    )
                })
                .collect()
        } else {
            Applied::default()
        };
        Some(Heartbeat {
            scope: scope.clone(),
            origin: self.id.clone(),
            sequence: own.sequence,
            timestamp: if self.stores_rows {
                timestamp.max(own.timestamp)
            } else {
                timestamp
            },
            applied,
            purge: s.purge_horizon,
            tree_edge: false,
            report_after: s.report_after,
        })
    }

    /// Whether this heartbeat must carry an applied-watermark report: an origin
    /// asked for one (`Heartbeat::report_after`) up to a sequence this replica now
    /// holds durably and has not reported yet. Marks those requests answered.
    fn answer_report_requests(&mut self, scope: &ScopeId) -> bool {
        let Some(s) = self.scopes.get_mut(scope) else {
            return false;
        };
        let mut due = false;
        for (origin, (asked, reported)) in &mut s.reports_asked {
            if *reported < *asked
                && s.streams
                    .get(origin)
                    .is_some_and(|st| st.durable.sequence >= *asked)
            {
                *reported = *asked;
                due = true;
            }
        }
        due
    }

    fn send_heartbeats(&mut self, now: Now) {
        let scopes: Vec<ScopeId> = self.scopes.keys().cloned().collect();
        let probe = now.mono_us >= self.next_probe_us;
        if probe {
            self.next_probe_us = now.mono_us + self.config.probe_interval_ms * 1_000;
        }
        for scope in scopes {
            let Some(hb) = self.own_heartbeat(now, &scope) else {
                continue;
            };
            if !hb.applied.is_empty() {
                let mine = Report::from_sorted(hb.applied.to_vec());
                if let Some(s) = self.scopes.get_mut(&scope) {
                    s.applied_by.insert(self.id.clone(), mine);
                }
            }
            let s = &self.scopes[&scope];
            // Tree neighbours are told we hold them as neighbours: they adopt us as
            // inbound. Everyone else gets the heartbeat without that flag: inbound
            // neighbours (so two replicas that are neighbours in neither's tree do
            // not keep each other inbound by sending to each other), and suspected
            // members on a probe round (hearing us is what heals a cut tree, I8;
            // adopting every prober made each replica forward the backlog of a
            // healed partition to the whole other side at once).
            let edges = s.tree.neighbours(&self.id);
            let mut to: Vec<(ReplicaId, bool)> = s
                .inbound
                .keys()
                .filter(|n| !edges.contains(n))
                .map(|n| (n.clone(), false))
                .collect();
            if probe {
                to.extend(
                    s.members
                        .iter()
                        .filter(|m| {
                            !edges.contains(m)
                                && !s.inbound.contains_key(*m)
                                && self.peers.get(m).is_some_and(|p| p.suspected)
                        })
                        .map(|m| (m.clone(), false)),
                );
            }
            to.extend(edges.iter().map(|n| (n.clone(), true)));
            for (n, tree_edge) in to {
                if let Some(p) = self.peers.get_mut(&n) {
                    p.heartbeats.push(Heartbeat {
                        tree_edge,
                        ..hb.clone()
                    });
                }
            }
        }
        self.heartbeats_sent += 1;
    }

    fn handle_heartbeats(
        &mut self,
        now: Now,
        from: &ReplicaId,
        hbs: Vec<Heartbeat>,
    ) -> Result<(), Error> {
        let inbound_until_us = now.mono_us + self.inbound_ttl_us();
        // Scopes where a report moved the end of our own stream (relearning).
        let mut relearn_gaps: Vec<ScopeId> = Vec::new();
        // Streams of origins gone quiet whose end a report moved.
        let mut quiet_gaps: Vec<(ScopeId, ReplicaId)> = Vec::new();
        // Whether `from` is a member of the last scope looked at: a frame's
        // heartbeats come in scope order.
        let mut from_member: Option<(ScopeId, bool)> = None;
        for hb in hbs {
            let Some(mut s) = self.scopes.get_mut(&hb.scope) else {
                self.reject(from, Reject::UnknownScope);
                continue;
            };
            let from_ok = match &from_member {
                Some((scope, ok)) if *scope == hb.scope => *ok,
                _ => {
                    let ok = s.members.contains(from);
                    from_member = Some((hb.scope.clone(), ok));
                    ok
                }
            };
            if !from_ok || !s.members.contains(&hb.origin) {
                self.reject(from, Reject::NotInScope);
                continue;
            }
            let origin_is_writer = s.origins.contains(&hb.origin);
            if hb.origin == *from && hb.tree_edge {
                s.adopt(from, inbound_until_us);
            }
            if hb.origin == self.id {
                continue;
            }
            // What this origin's clock says against ours (a relayed heartbeat reads
            // a path's latency low: far below any max offset).
            let offset_ms = hb.timestamp.wall_ms() as i64 - now.wall_ms as i64;
            match self.peer_clocks.get_mut(&hb.origin) {
                Some(c) => c.record(offset_ms, now.mono_us),
                None => {
                    self.peer_clocks
                        .insert(&hb.origin, PeerClock::new(offset_ms, now.mono_us));
                }
            }
            if self.clock.observe(now.wall_ms, hb.timestamp).is_err() {
                self.reject(from, Reject::TimestampAhead);
                continue;
            }
            if note_heard(&mut self.peers, now, &hb.origin) {
                // Scopes are rebuilt: look ours up again, and membership.
                self.recovered(now, &hb.origin);
                from_member = None;
                s = self.scopes.get_mut(&hb.scope).expect("checked above");
            }
            if hb.report_after > 0 && origin_is_writer {
                let asked = s.reports_asked.entry(hb.origin.clone()).or_default();
                asked.0 = asked.0.max(hb.report_after);
            }
            if !hb.applied.is_empty() {
                match s.applied_by.get_mut(&hb.origin) {
                    Some(r) => r.raise(&hb.applied),
                    None => s
                        .applied_by
                        .entry(hb.origin.clone())
                        .or_default()
                        .raise(&hb.applied),
                }
                let at = s
                    .reported_at
                    .entry(hb.origin.clone())
                    .or_insert((hb.timestamp, now.mono_us));
                if hb.timestamp >= at.0 {
                    *at = (hb.timestamp, now.mono_us);
                }
                // Writes of an origin gone quiet that the reporter has and we lack:
                // no heartbeat of that origin will announce them, so the report
                // does, and gap repair fetches them from the reporter.
                if origin_is_writer && hb.applied.len() == s.origin_ids.len() {
                    for (i, (o, w)) in hb.applied.iter().enumerate() {
                        let quiet = now
                            .wall_ms
                            .saturating_sub(s.durable_marks[i].timestamp.wall_ms())
                            > self.config.suspect_after_ms;
                        if quiet && *o == s.origin_ids[i] && *o != self.id && *o != hb.origin {
                            let st = s.streams.get_or_default(o);
                            if w.sequence > st.known_last {
                                st.known_last = w.sequence;
                                st.hint = Some(hb.origin.clone());
                                // Nothing of a quiet origin is in flight: no grace.
                                st.behind_since_us = Some(
                                    now.mono_us.saturating_sub(self.config.gap_grace_ms * 1_000),
                                );
                                quiet_gaps.push((hb.scope.clone(), o.clone()));
                            }
                        }
                    }
                }
                // The reporter is heard now: vouching holds only as of its report
                // (a reporter heard again may report from before the vouched
                // time), and not at all for an origin it has writes of that this
                // replica lacks. At once, not at the next round.
                if let Some(v) = &s.vouched {
                    let floor = s.created_floor;
                    let at = hb.timestamp.max(floor);
                    let lacks = |i: usize| {
                        hb.applied
                            .iter()
                            .find(|(o, _)| *o == s.origin_ids[i])
                            .is_some_and(|(_, w)| w.sequence > s.durable_marks[i].sequence)
                    };
                    let lowered = |i: usize| -> Timestamp {
                        if v[i] <= floor || s.origin_ids[i] == hb.origin {
                            v[i]
                        } else if lacks(i) {
                            floor
                        } else {
                            v[i].min(at)
                        }
                    };
                    if (0..v.len()).any(|i| lowered(i) != v[i]) {
                        let kept: Vec<Timestamp> = (0..v.len()).map(lowered).collect();
                        s.vouched = Some(kept.into());
                    }
                }
                if let Some(r) = self.relearning.get_mut(&hb.scope)
                    && origin_is_writer
                {
                    // How far another origin applied our own stream.
                    r.reported.insert(hb.origin.clone());
                    r.first_report_us.get_or_insert(now.mono_us);
                    let reported = hb
                        .applied
                        .iter()
                        .find(|(o, _)| *o == self.id)
                        .map_or(0, |(_, w)| w.sequence);
                    let st = s.streams.get_or_default(&self.id);
                    if reported > st.known_last {
                        st.known_last = reported;
                        st.hint = Some(hb.origin.clone());
                        relearn_gaps.push(hb.scope.clone());
                    }
                }
            }
            let st = s.streams.get_or_default(&hb.origin);
            // Only news travels on, so copies arriving over other paths stop here.
            let news = hb.timestamp > st.heartbeat.1 || hb.sequence > st.heartbeat.0;
            if !news {
                continue;
            }
            st.heartbeat = (
                st.heartbeat.0.max(hb.sequence),
                st.heartbeat.1.max(hb.timestamp),
            );
            // Whether the stream misses entries: `maybe_request_gap`'s first test,
            // made here so that a stream that misses nothing costs no lookups.
            let mut behind = false;
            if origin_is_writer {
                st.known_last = st.known_last.max(hb.sequence);
                if st.applied.sequence >= hb.sequence {
                    if hb.timestamp > st.applied.timestamp {
                        st.applied.timestamp = hb.timestamp;
                        st.dirty = true;
                        list_moved(&mut self.moved, st, &hb.scope, &hb.origin);
                    }
                } else {
                    st.hint = Some(from.clone());
                }
                let last = match st.pending.keys().next() {
                    Some(p) => p - 1,
                    None => st.known_last,
                };
                behind = last > st.applied.sequence;
            }
            // Relayed, it no longer comes from its origin.
            let hb = Heartbeat {
                tree_edge: false,
                ..hb
            };
            let i = match s
                .heartbeat_news
                .binary_search_by(|(h, _)| h.origin.cmp(&hb.origin))
            {
                Ok(i) => {
                    s.heartbeat_news[i] = (hb, from.clone());
                    i
                }
                Err(i) => {
                    s.heartbeat_news.insert(i, (hb, from.clone()));
                    i
                }
            };
            if self.forward_heartbeats_at_us.is_none() {
                self.forward_heartbeats_at_us =
                    Some(now.mono_us + self.config.heartbeat_forward_delay_ms * 1_000);
            }
            if behind {
                let hb = &s.heartbeat_news[i].0;
                let (scope, origin) = (hb.scope.clone(), hb.origin.clone());
                self.maybe_request_gap(now, &scope, &origin);
            }
        }
        let id = self.id.clone();
        for scope in relearn_gaps {
            self.maybe_request_gap(now, &scope, &id);
        }
        for (scope, origin) in quiet_gaps {
            self.maybe_request_gap(now, &scope, &origin);
        }
        Ok(())
    }

    fn forward_heartbeat_news(&mut self) {
        // Each peer gets its heartbeats in scope order, then origin order: one
        // lookup per neighbour and scope, the scope's news walked per neighbour.
        for s in self.scopes.values_mut() {
            if s.heartbeat_news.is_empty() {
                continue;
            }
            for n in s.forward_set(&self.id) {
                let mut news = s
                    .heartbeat_news
                    .iter()
                    .filter(|(hb, came_from)| n != came_from && *n != hb.origin)
                    .peekable();
                if news.peek().is_none() {
                    continue;
                }
                if let Some(p) = self.peers.get_mut(n) {
                    p.heartbeats.extend(news.map(|(hb, _)| hb.clone()));
                }
            }
            s.heartbeat_news.clear();
        }
    }

    // ----- compaction -----

    /// Recomputes purge horizons, truncates logs below them, and sweeps some rows.
    #[inline(never)]
    fn compact(&mut self, now: Now) -> Result<(), Error> {
        const SWEEP_ROWS_MAX: usize = 1_000;
        let d = self.deployment.clone();
        let scopes: Vec<ScopeId> = self.scopes.keys().cloned().collect();
        for scope in scopes {
            let s = self.scopes.get_mut(&scope).expect("listed above");
            // Our own durable state counts as our report.
            let mine = Report::from_sorted(s.durable_watermarks().collect());
            s.applied_by.insert(self.id.clone(), mine);
            // The horizon needs a report from every member (I5): until then, nothing.
            let complete = s.members.iter().all(|m| s.applied_by.contains_key(m));
            if !complete || s.origins.is_empty() {
                continue;
            }
            // Per origin (in origin order), the least any member reported; an origin
            // missing from a report counts as nothing applied. Both are in origin
            // order, so each report is one walk.
            let mut horizon_seq = vec![u64::MAX; s.origins.len()];
            let mut horizon_ts = Timestamp::MAX;
            for m in &s.members {
                let mut report = s.applied_by[m].0.iter().peekable();
                for (o, h) in s.origins.iter().zip(&mut horizon_seq) {
                    while report.next_if(|(r, _)| r < o).is_some() {}
                    let w = report
                        .next_if(|(r, _)| r == o)
                        .map_or_else(Watermark::default, |(_, w)| *w);
                    *h = (*h).min(w.sequence);
                    horizon_ts = horizon_ts.min(w.timestamp);
                }
            }
            if horizon_ts > s.purge_horizon {
                s.purge_horizon = horizon_ts;
            }
            let mut batch = WriteBatch::default();
            for (o, h) in s.origins.iter().zip(horizon_seq) {
                let applied = s.streams.get(o).map_or(0, |st| st.durable.sequence);
                let keep_from =
                    (h + 1).max(applied.saturating_sub(self.config.log_entries_retained_max));
                if let Some((first, _)) = self.storage.log_bounds(&scope, o)?
                    && first < keep_from
                {
                    batch
                        .truncate_log
                        .push((scope.clone(), o.clone(), keep_from));
                }
            }
            if !batch.is_empty() {
                self.storage.write(batch)?;
            }
        }
        // Sweep: purge tombstones and expired versions of rows nobody writes to.
        if self.stores_rows {
            let tables: Vec<Arc<str>> = d.placement.schema.tables.keys().cloned().collect();
            if tables.is_empty() {
                return Ok(());
            }
            let (table, after) = self
                .sweep
                .take()
                .unwrap_or_else(|| (tables[0].clone(), Bytes::new()));
            // Rows are looked at in place; only those compaction changes are copied.
            let schema = d.placement.schema.table(&table);
            let (location, scopes) = (&self.location, &self.scopes);
            // A row that needs nothing at the latest horizon of any scope needs
            // nothing at its own (purging only grows with the horizon): most rows are
            // passed over on their compaction hint alone, before finding their scope.
            let latest_horizon = scopes.values().map(|s| s.purge_horizon).max();
            // Keys by the horizon of their scope.
            let mut due: BTreeMap<Timestamp, Vec<Bytes>> = BTreeMap::new();
            let last = self.storage.visit_rows(
                &table,
                b"",
                (!after.is_empty()).then_some(&after[..]),
                SWEEP_ROWS_MAX,
                &mut |key, row| {
                    if latest_horizon.is_none_or(|h| !row.needs_compact(schema, h, now.wall_ms)) {
                        return;
                    }
                    let scope = location.scope_of(&d, &table, key);
                    if let Some(horizon) = scopes.get(&scope).map(|s| s.purge_horizon)
                        && row.needs_compact(schema, horizon, now.wall_ms)
                    {
                        due.entry(horizon).or_default().push(key.clone());
                    }
                },
            )?;
            for (horizon, keys) in due {
                let c = Compaction {
                    deployment: &d,
                    horizon,
                    now_ms: now.wall_ms,
                };
                self.storage.compact_rows(&table, keys, &c)?;
            }
            let next = match last {
                Some(k) => (table, k),
                None => {
                    let i = tables
                        .iter()
                        .position(|t| *t == table)
                        .map_or(0, |i| (i + 1) % tables.len());
                    (tables[i].clone(), Bytes::new())
                }
            };
            self.sweep = Some(next);
        }
        Ok(())
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
            self.compact(now)?;
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
    /// rises to the earliest of their last reports, if none of them reported more
    /// of that origin's stream than this replica holds durably. So "vouched as of
    /// T" means: as of T, no replica this one hears had applied a write of the
    /// origin that this one lacks. A replica that hears no other origin of the
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
                        vouchable = false; // it has writes we lack: gap repair first
                        break;
                    }
                    earliest = Some(earliest.map_or(at, |e| e.min(at)));
                }
                if let Some(at) = earliest.filter(|_| vouchable) {
                    vouched[i] = vouched[i].max(at);
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
    pub fn heard_reporters(&self, scope: &ScopeId, now: Now) -> Vec<ReplicaId> {
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
            .cloned()
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
        let tree = self.scopes.get(&ScopeId::global()).map(|s| &s.tree);
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
        for (scope, s) in &mut self.scopes {
            if let Some(inc) = &s.incoming
                && now.mono_us.saturating_sub(inc.asked_at_us) > snapshot_timeout_us
            {
                // The snapshot stalled (sender gone?): forget it; gap repair will
                // start over and ask someone else.
                s.incoming = None;
            }
            for (origin, st) in &s.streams {
                if st.known_last > st.applied.sequence {
                    work.push((scope.clone(), origin.clone()));
                }
            }
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
