//! The driver: one task owns the replication core (`pangea_core::replica::Replica`)
//! and feeds it inputs in order, as quinn's `ConnectionDriver` drives quinn-proto.
//!
//! Each turn: take every queued input (frames from peers, local writes, send reports),
//! or the timer if it fired; then `flush` — one fsync for the whole turn (group
//! commit) — and only then acknowledge local writes, hand frames to the peer tasks
//! and publish the new durable watermarks for the serving path. The placement
//! migration jobs this replica runs (`pangea_core::migration::Job`) are stepped
//! each turn before the flush, with the core.

use crate::Shared;
use crate::metrics::NodeMetrics;
use pangea_core::frame::Frame;
use pangea_core::migration::{self, Job, Progress};
use pangea_core::replica::{Event, Replica, Transmit};
use pangea_core::{Error as CoreError, RowMutation, ScopeId, Token};
use pangea_store::Store;
use pangea_topology::{RegionId, ReplicaId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Most inputs handled in one turn before a flush, so a flood of frames cannot delay
/// acknowledgements indefinitely.
const INPUTS_PER_TURN_MAX: usize = 1_024;

/// Most time spent handling inputs in one turn before its flush: a burst of
/// replication frames (a peer's bulk load, a gap fill) is applied in slices, and
/// a client's write that arrives meanwhile is made durable and acknowledged
/// after at most one slice and one fsync, not after the whole burst. Long
/// enough that the flush's fsync stays a small share of a busy turn.
const TURN_BUDGET: std::time::Duration = std::time::Duration::from_millis(5);

/// What the driver reads from: clients' writes (and their waits for other
/// regions) in a lane of their own, taken before anything in the other lane —
/// peers' frames, send reports, operators' requests. A replication flood that
/// fills its lane therefore neither blocks a client's write from being queued
/// nor puts it behind the frames already queued. Writes cannot starve the rest:
/// each waits for its turn's flush before its caller can send another, so a turn
/// takes at most the client requests admitted at once (`client_requests_max`)
/// before the frames.
#[derive(Debug)]
pub struct Inbox {
    writes: mpsc::Receiver<Input>,
    rest: mpsc::Receiver<Input>,
}

impl Inbox {
    /// The driver's inbox, and the senders for the writes' lane and the rest.
    pub fn new(capacity: usize) -> (mpsc::Sender<Input>, mpsc::Sender<Input>, Inbox) {
        let (writes_tx, writes) = mpsc::channel(capacity);
        let (rest_tx, rest) = mpsc::channel(capacity);
        (writes_tx, rest_tx, Inbox { writes, rest })
    }

    /// The next input, writes first; `None` once both lanes are closed.
    async fn recv(&mut self) -> Option<Input> {
        tokio::select! {
            biased;
            Some(input) = self.writes.recv() => Some(input),
            Some(input) = self.rest.recv() => Some(input),
            else => None,
        }
    }

    /// An input already queued, writes first.
    fn try_recv(&mut self) -> Option<Input> {
        self.writes
            .try_recv()
            .or_else(|_| self.rest.try_recv())
            .ok()
    }
}

/// What the driver is told.
#[derive(Debug)]
pub enum Input {
    Frame {
        from: ReplicaId,
        frame: Frame,
    },
    Malformed {
        from: ReplicaId,
        reason: &'static str,
    },
    /// A client write; the reply comes once it is durable.
    Propose {
        mutation: RowMutation,
        reply: oneshot::Sender<Result<Token, Unacked>>,
    },
    /// An operator's placement move: checked, then run here; the reply (the job's
    /// id, or why the move was refused) comes once the job is recorded durably.
    StartMigration {
        request: migration::Request,
        reply: oneshot::Sender<Result<String, String>>,
    },
    /// A client waits for this replica's write `sequence` in `scope` to reach
    /// other regions: ask the members for prompt reports (`Replica::want_reports`)
    /// and answer where it has been applied so far (`Replica::regions_applied`).
    RegionsApplied {
        scope: ScopeId,
        sequence: u64,
        reply: oneshot::Sender<Option<(BTreeSet<RegionId>, BTreeSet<RegionId>)>>,
    },
    /// A loader registers a change-stream reader at a cursor
    /// (`Replica::register_reader`); the reply says whether it was taken.
    RegisterReader {
        name: String,
        cursor: pangea_core::changes::Cursor,
        reply: oneshot::Sender<Result<(), String>>,
    },
    /// A peer task wrote (or dropped) a frame of this many bytes.
    Sent {
        to: ReplicaId,
        bytes: usize,
    },
    /// A new deployment (topology or placement reloaded).
    View(Arc<pangea_topology::Deployment>),
    /// Flush and stop.
    Shutdown {
        done: oneshot::Sender<()>,
    },
}

/// Where frames for each peer go: one bounded queue per peer task.
pub type PeerQueues = BTreeMap<ReplicaId, mpsc::Sender<Transmit>>;

type Waiters = BTreeMap<(ScopeId, ReplicaId, u64), oneshot::Sender<Result<Token, Unacked>>>;

/// Why a client write was not acknowledged: whether it may have been applied
/// decides whether the client may send it to another replica.
#[derive(Debug)]
pub enum Unacked {
    /// Refused before anything of it was written.
    Refused(CoreError),
    /// The store failed while its turn was being made durable: what was written
    /// may survive, so the write may or may not have happened.
    Unknown(CoreError),
}

/// The migration jobs this replica runs, each with the operator waiting to hear
/// that it started (none for a resumed job).
type Jobs = Vec<(Job, Option<oneshot::Sender<Result<String, String>>>)>;

/// The unfinished jobs this replica was running, from its store.
fn resume(replica: &Replica<Store>) -> Jobs {
    match migration::resumable(replica) {
        Ok(jobs) => jobs
            .into_iter()
            .map(|job| {
                let r = job.record();
                tracing::info!(job = %r.id, phase = %r.phase, rows = r.rows_copied, "resuming migration job");
                (job, None)
            })
            .collect(),
        Err(e) => {
            tracing::error!(error = %pangea_core::Chain(&e), "cannot read migration jobs");
            Vec::new()
        }
    }
}

/// Steps every job (before the turn's flush). `true`: one of them wants another
/// turn as soon as this one's flush is done. `Err`: the store failed.
fn step_jobs(
    replica: &mut Replica<Store>,
    shared: &Shared,
    jobs: &mut Jobs,
) -> Result<bool, CoreError> {
    let now = shared.clock.now();
    for record in replica.take_assigned_jobs() {
        if !jobs.iter().any(|(j, _)| j.id() == record.id) {
            tracing::info!(job = %record.id, of = %record.part_of, "starting a part of a migration job");
            jobs.push((Job::resumed(record), None));
        }
    }
    let mut again = false;
    let mut i = 0;
    while i < jobs.len() {
        let (job, started) = &mut jobs[i];
        let progress = job.step(replica, now)?;
        if job.is_recorded()
            && let Some(reply) = started.take()
        {
            let _ = reply.send(Ok(job.id().to_owned()));
        }
        match progress {
            Progress::Again => again = true,
            Progress::Waiting => {}
            Progress::Finished => {
                let r = job.record();
                match r.phase.as_str() {
                    "done" => tracing::info!(job = %r.id, rows = r.rows_copied, "migration done"),
                    _ => tracing::error!(job = %r.id, error = %r.error, "migration job failed"),
                }
                jobs.swap_remove(i);
                continue;
            }
        }
        i += 1;
    }
    Ok(again)
}

pub async fn run(
    mut replica: Replica<Store>,
    mut inbox: Inbox,
    shared: Arc<Shared>,
    mut peers: PeerQueues,
) {
    let mut waiters: Waiters = BTreeMap::new();
    let mut record = crate::readiness::Record::read(&shared.config.data_dir);
    if record.is_none() {
        // A store this replica does not trust may lack the replica's own writes.
        replica.relearn_own_streams(shared.clock.now());
    }
    // The gate's clock: time since the driver started.
    let epoch = std::time::Instant::now();
    let mut gate = crate::readiness::Gate::new(
        std::time::Duration::ZERO,
        std::time::Duration::from_millis(replica.config().heartbeat_interval_ms),
        record.is_some(),
    );
    let mut gate_log = crate::readiness::PhaseLog::new(epoch);
    loop {
        publish(&replica, &shared);
        let mut jobs = resume(&replica);
        let failed = turns(
            &mut replica,
            &mut inbox,
            &shared,
            &mut peers,
            (&mut waiters, &mut jobs),
            (&mut gate, &mut gate_log, epoch),
            &mut record,
        )
        .await;
        let Some(error) = failed else { return };
        // The store failed (a full disk, most likely): close it, reopen it once
        // there is room, and carry on with a core rebuilt from it.
        match recover(replica, &shared, &mut inbox, error).await {
            Some(r) => replica = r,
            None => return,
        }
        if record.is_none() {
            replica.relearn_own_streams(shared.clock.now());
        }
    }
}

/// The store failed (`e`): nothing of this turn is acknowledged, and the writers
/// are told why (a full disk, most often). Returns `e` for the caller to reopen.
fn store_failed(shared: &Shared, waiters: &mut Waiters, e: CoreError) -> CoreError {
    shared.disk.failed(
        pangea_core::Chain(&e).to_string(),
        crate::disk::free_bytes(&shared.config.data_dir).ok(),
    );
    for (_, w) in std::mem::take(waiters) {
        let _ = w.send(Err(Unacked::Unknown(e.clone())));
    }
    e
}

/// Whether a write's error means the store itself failed (fjall poisons itself
/// after a failed write or fsync, a full disk most often, possibly in one of its
/// own threads before the driver's next flush sees it).
fn store_broke(e: &CoreError) -> bool {
    matches!(e, CoreError::Storage(pangea_core::StorageError::Io { .. }))
}

/// A write met a failed store (`e`): it is refused with the store's state, and
/// `e` goes back to the turn loop, which reopens the store.
fn refuse_broken(
    shared: &Shared,
    reply: oneshot::Sender<Result<Token, Unacked>>,
    e: CoreError,
) -> CoreError {
    tracing::error!(error = %pangea_core::Chain(&e), "a write found the store failed; refusing writes");
    shared.disk.failed(
        pangea_core::Chain(&e).to_string(),
        crate::disk::free_bytes(&shared.config.data_dir).ok(),
    );
    let _ = reply.send(Err(Unacked::Refused(told(shared))));
    e
}

/// What a writer is told while the store is failed.
fn told(shared: &Shared) -> CoreError {
    CoreError::Storage(pangea_core::StorageError::Closed {
        replica: shared.id.to_string(),
        state: shared.disk.state().to_string(),
    })
}

/// Turns until the node stops (`None`) or the store fails (`Some`, every waiting
/// write told so).
async fn turns(
    replica: &mut Replica<Store>,
    inbox: &mut Inbox,
    shared: &Arc<Shared>,
    peers: &mut PeerQueues,
    (waiters, jobs): (&mut Waiters, &mut Jobs),
    (gate, gate_log, epoch): (
        &mut crate::readiness::Gate,
        &mut crate::readiness::PhaseLog,
        std::time::Instant,
    ),
    record: &mut Option<crate::readiness::Record>,
) -> Option<CoreError> {
    let mut shutdown: Option<oneshot::Sender<()>> = None;
    let mut gauges_at = std::time::Instant::now();
    let mut jobs_again = false;
    loop {
        let deadline = if jobs_again {
            Some(tokio::time::Instant::now())
        } else {
            replica
                .poll_timeout()
                .map(|t| tokio::time::Instant::from_std(shared.clock.instant_of(t)))
        };
        tokio::select! {
            input = inbox.recv() => {
                let input = input?;
                let started = std::time::Instant::now();
                let mut next = Some(input);
                let mut handled = 0;
                while let Some(input) = next.take() {
                    if let Input::View(d) = input {
                        view(replica, shared, d, peers);
                    } else if let Some(e) = handle(replica, shared, input, (waiters, jobs), &mut shutdown) {
                        return Some(store_failed(shared, waiters, e));
                    }
                    handled += 1;
                    if handled >= INPUTS_PER_TURN_MAX
                        || shutdown.is_some()
                        || started.elapsed() >= TURN_BUDGET
                    {
                        break;
                    }
                    next = inbox.try_recv();
                }
            }
            _ = sleep_until(deadline) => {
                let now = shared.clock.now();
                if let Err(e) = replica.handle_timeout(now) {
                    tracing::error!(error = %pangea_core::Chain(&e), "replication timer failed");
                }
            }
        }
        jobs_again = match step_jobs(replica, shared, jobs) {
            Ok(again) => again,
            Err(e) => {
                tracing::error!(error = %pangea_core::Chain(&e), "a migration job found the store failed");
                return Some(store_failed(shared, waiters, e));
            }
        };
        let now = shared.clock.now();
        if let Err(e) = replica.flush(now) {
            tracing::error!(error = %pangea_core::Chain(&e), "flush failed; refusing writes");
            return Some(store_failed(shared, waiters, e));
        }
        // Gauges owned by the core, and the clock fence, at most ten times a second.
        if gauges_at.elapsed() >= std::time::Duration::from_millis(100) {
            gauges_at = std::time::Instant::now();
            let fence = replica.clock_fence(now).map(|e| e.to_string());
            if shared.published.set_clock_fence(fence.clone()) {
                match &fence {
                    Some(why) => tracing::error!(%why, "clock fenced: refusing writes"),
                    None => tracing::info!("clock agrees with the peers again: accepting writes"),
                }
            }
            for (peer, bytes) in replica.inflight_bytes() {
                shared
                    .metrics
                    .set_inflight_bytes(peer.as_str(), bytes as i64);
            }
        }
        // Publish first: a client holding a token from this turn's acknowledgements
        // must find it covered here (the origin always covers its own writes).
        publish(replica, shared);
        let phase = if peers.is_empty() {
            gate.open()
        } else if gate.phase() == &crate::readiness::Phase::Ready {
            None
        } else {
            let at = std::time::Instant::now();
            let changed = gate.update(
                at - epoch,
                replica.stats().frames_received,
                replica.stream_progress(),
                &replica.unheard_scopes(),
                &replica.relearning_scopes().cloned().collect::<Vec<_>>(),
            );
            gate_log.note(at, gate, changed.as_ref());
            changed
        };
        // Caught up once: from now on this replica trusts its store.
        if phase == Some(crate::readiness::Phase::Ready)
            && *record != Some(crate::readiness::Record::CaughtUp)
        {
            match crate::readiness::Record::CaughtUp.write(&shared.config.data_dir) {
                Ok(()) => *record = Some(crate::readiness::Record::CaughtUp),
                Err(e) => {
                    tracing::error!(error = %pangea_core::Chain(&e), "cannot record that this replica caught up")
                }
            }
        }
        if let Some(phase) = phase {
            shared.published.set_phase(phase);
        }
        // Only now that readers see the new placement may moved rows disappear.
        match replica.purge_moved_rows() {
            Ok(purged) => {
                for p in purged {
                    let target = format!(
                        "{} prefix {}",
                        p.table,
                        pangea_core::redact::RedactedKey(&p.prefix)
                    );
                    shared.audit.record(
                        &crate::audit_log::replica_itself(&shared.id),
                        "purge",
                        &target,
                        crate::audit_log::Outcome::Ok,
                        &if p.job_id == pangea_core::replica::RESIZE_PURGE {
                            format!(
                                "{} rows of shard groups this process no longer hosts (resize)",
                                p.rows
                            )
                        } else {
                            format!("{} rows moved away by migration job {}", p.rows, p.job_id)
                        },
                    );
                }
            }
            Err(e) => tracing::error!(error = %pangea_core::Chain(&e), "purging moved rows failed"),
        }
        drain_events(replica, shared, waiters);
        drain_transmits(replica, shared, peers);
        if let Some(done) = shutdown.take() {
            let _ = done.send(());
            return None;
        }
    }
}

/// Free space a store with no reserve waits for before it is reopened.
const REOPEN_FREE_MIN_BYTES: u64 = 16 << 20;

/// A failed store: the core is dropped at once; reads go on from the store (fjall
/// refuses only writes) until the disk has room, then the store is closed and
/// reopened — fjall recovers from its journal as after a crash — and the core
/// rebuilt from it. Meanwhile writes are refused and peers' frames dropped (gap
/// repair fetches them later). `None`: the node stopped meanwhile.
async fn recover(
    replica: Replica<Store>,
    shared: &Arc<Shared>,
    inbox: &mut Inbox,
    error: CoreError,
) -> Option<Replica<Store>> {
    // `shared.disk` already says why (the failed flush set it).
    use crate::disk;
    let config = replica.config().clone();
    // The core goes; the serving path keeps its handle, so reads go on from the
    // store (fjall refuses only writes) until it is reopened.
    drop(replica);
    shared.published.set_healthy(false);
    let chain = pangea_core::Chain(&error);
    tracing::error!(error = %chain, "storage failed: store closed; it is reopened once the disk has room");
    let failed_at = std::time::Instant::now();
    let unavailable = || told(shared);
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            input = inbox.recv() => match input {
                None => return None,
                Some(Input::Shutdown { done }) => {
                    let _ = done.send(());
                    return None;
                }
                Some(Input::Propose { reply, .. }) => {
                    let _ = reply.send(Err(Unacked::Refused(unavailable())));
                }
                Some(Input::StartMigration { reply, .. }) => {
                    let _ = reply.send(Err(unavailable().to_string()));
                }
                Some(Input::RegionsApplied { reply, .. }) => {
                    let _ = reply.send(None);
                }
                Some(Input::RegisterReader { reply, .. }) => {
                    let _ = reply.send(Err(unavailable().to_string()));
                }
                // Frames: fetched again by gap repair. A new deployment: read from
                // `shared` when the core is rebuilt.
                Some(_) => {}
            },
            _ = tick.tick() => {
                let need = shared.disk.reserve_bytes().max(REOPEN_FREE_MIN_BYTES);
                match disk::free_bytes(&shared.config.data_dir) {
                    Ok(free) if free >= need => {}
                    _ => continue,
                }
                // The last handle goes, so that fjall lets the directory be opened.
                shared.set_store(None);
                let opened =
                    Store::open(&shared.config.data_dir, crate::store_options(&shared.config));
                let store = match opened {
                    Ok(s) => {
                        crate::priority::lower_store_workers(shared.config.compaction_nice);
                        s
                    }
                    Err(e) => {
                        // Locked while fjall's own threads let go of the old one.
                        let error = pangea_core::Chain(&e);
                        tracing::warn!(%error, "reopening the store failed; retrying");
                        continue;
                    }
                };
                let rebuilt = Replica::new(
                    shared.id.clone(),
                    shared.deployment(),
                    config.clone(),
                    store.clone(),
                    shared.seed,
                    shared.clock.now(),
                );
                match rebuilt {
                    Ok(r) => {
                        shared.set_store(Some(store));
                        shared.disk.reopened();
                        shared.published.set_healthy(true);
                        tracing::info!(
                            after_ms = failed_at.elapsed().as_millis() as u64,
                            "store reopened: accepting writes"
                        );
                        return Some(r);
                    }
                    Err(e) => tracing::error!(error = %pangea_core::Chain(&e), "rebuilding the core on the reopened store failed; retrying"),
                }
            }
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn handle(
    replica: &mut Replica<Store>,
    shared: &Shared,
    input: Input,
    (waiters, jobs): (&mut Waiters, &mut Jobs),
    shutdown: &mut Option<oneshot::Sender<()>>,
) -> Option<CoreError> {
    let now = shared.clock.now();
    match input {
        // With the disk full, replicated rows wait (`disk`): the peer's gap repair
        // sends them again once there is room.
        Input::Frame {
            frame: Frame::Mutations(_) | Frame::GapFill(_) | Frame::SnapshotChunk(_),
            ..
        } if shared.disk.holding() => {
            shared.metrics.inc_frames_rejected("disk_full");
        }
        Input::Frame { from, frame } => {
            let heartbeats = matches!(frame, Frame::Heartbeats(_));
            if let Err(e) = replica.handle_frame(now, &from, frame) {
                tracing::error!(peer = %from, error = %pangea_core::Chain(&e), "applying a frame failed");
            }
            if heartbeats {
                shared.published.heartbeats_heard().notify_waiters();
            }
        }
        Input::Malformed { from, reason } => {
            replica.note_malformed(&from);
            shared.metrics.inc_frames_rejected(reason);
        }
        Input::Propose { mutation, reply } => match replica.propose(now, mutation) {
            Ok(token) => {
                waiters.insert(
                    (token.scope.clone(), token.origin.clone(), token.sequence),
                    reply,
                );
            }
            Err(e) if store_broke(&e) => return Some(refuse_broken(shared, reply, e)),
            Err(e) => {
                let _ = reply.send(Err(Unacked::Refused(e)));
            }
        },
        Input::StartMigration { request, reply } => {
            match Job::plan(replica, &shared.deployed.files(), request, now) {
                Ok(job) => jobs.push((job, Some(reply))),
                Err(refused) => {
                    let _ = reply.send(Err(refused.to_string()));
                }
            }
        }
        Input::RegionsApplied {
            scope,
            sequence,
            reply,
        } => {
            replica.want_reports(&scope, sequence);
            let id = replica.id().clone();
            let _ = reply.send(replica.regions_applied(&scope, &id, sequence));
        }
        Input::RegisterReader {
            name,
            cursor,
            reply,
        } => {
            let taken = replica.register_reader(now, &name, cursor);
            let _ = reply.send(taken.map_err(|e| e.to_string()));
        }
        Input::Sent { to, bytes } => replica.handle_sent(&to, bytes),
        Input::View(_) => {}
        Input::Shutdown { done } => *shutdown = Some(done),
    }
    None
}

fn drain_events(replica: &mut Replica<Store>, shared: &Shared, waiters: &mut Waiters) {
    let m: &NodeMetrics = &shared.metrics;
    while let Some(e) = replica.poll_event() {
        match e {
            Event::Committed(token) => {
                if let Some(w) =
                    waiters.remove(&(token.scope.clone(), token.origin.clone(), token.sequence))
                {
                    let _ = w.send(Ok(token));
                }
            }
            Event::Applied {
                scope,
                origin,
                timestamp,
                ..
            } => {
                m.inc_applied(scope.as_str(), origin.as_str());
                if origin != shared.id {
                    let now_us = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
                    shared
                        .apply_lag
                        .record(&origin, timestamp.wall_ms(), now_us);
                }
            }
            Event::Rejected { reason, .. } => {
                if reason == pangea_core::replica::Reject::NotInScope {
                    shared
                        .residency
                        .from_outsiders
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    m.inc_residency_violation();
                }
                m.inc_frames_rejected(reason.as_str());
            }
            Event::PeerSuspected(p) => {
                tracing::warn!(peer = %p, "peer suspected");
                m.set_peer_suspected(p.as_str(), true);
            }
            Event::PeerRecovered(p) => {
                tracing::info!(peer = %p, "peer recovered");
                m.set_peer_suspected(p.as_str(), false);
            }
            Event::TreeChanged { scope, edges } => tracing::info!(%scope, edges, "tree changed"),
            Event::SnapshotNeeded { scope, from } => {
                tracing::info!(%scope, %from, "snapshot requested")
            }
            Event::SnapshotInstalled { scope, rows } => {
                tracing::info!(%scope, rows, "snapshot installed")
            }
            Event::OwnStreamLearned { scope, sequence } => {
                tracing::info!(%scope, sequence, "own stream relearned from peers: accepting writes")
            }
            Event::GapDetected {
                scope,
                origin,
                from,
                to,
            } => {
                tracing::debug!(%scope, %origin, from, to, "gap detected");
            }
            Event::WatermarkAdvanced { .. } => {}
            Event::LocationRefused(invalid) => {
                tracing::error!(%invalid, "location entry not in force");
                m.inc_frames_rejected("invalid_location_entry");
            }
            Event::PurgeWithheld {
                table,
                prefix,
                policy,
            } => {
                let target = format!(
                    "{table} prefix {} -> {policy}",
                    pangea_core::redact::RedactedKey(&prefix)
                );
                tracing::warn!(%target, "a location entry moves rows away without a migration flip: rows kept");
                shared.audit.record(
                    &crate::audit_log::replica_itself(&shared.id),
                    "purge",
                    &target,
                    crate::audit_log::Outcome::Denied,
                    "no migration job flipped these rows: kept (the residency audit reports them)",
                );
            }
        }
    }
}

/// A reloaded deployment: the core recomputes scopes and trees; links to new peers
/// start, links to departed ones end (dropping a queue ends its task).
fn view(
    replica: &mut Replica<Store>,
    shared: &Arc<Shared>,
    d: Arc<pangea_topology::Deployment>,
    peers: &mut PeerQueues,
) {
    replica.handle_view(shared.clock.now(), d.clone());
    let wanted = crate::peer_addresses(&d, &shared.id);
    peers.retain(|p, _| {
        let keep = wanted.contains_key(p);
        if !keep {
            shared.metrics.forget_peer(p.as_str());
        }
        keep
    });
    for (peer, addr) in wanted {
        if !peers.contains_key(&peer) {
            tracing::info!(%peer, %addr, "new peer");
            peers.insert(peer.clone(), crate::peers::spawn(shared, peer, addr));
        }
    }
}

fn drain_transmits(replica: &mut Replica<Store>, shared: &Shared, peers: &PeerQueues) {
    while let Some(t) = replica.poll_transmit() {
        let (to, bytes) = (t.to.clone(), t.bytes);
        let delivered = peers.get(&to).is_some_and(|q| q.try_send(t).is_ok());
        if !delivered {
            // The peer's queue is full (it is slow or unreachable): drop the frame;
            // gap repair fetches what it carried (I8).
            replica.handle_sent(&to, bytes);
            shared.metrics.inc_frames_rejected("peer_queue_full");
        }
    }
}

/// Makes the durable watermarks visible to the serving path.
fn publish(replica: &Replica<Store>, shared: &Shared) {
    let wms: BTreeMap<_, _> = replica
        .scopes()
        .filter_map(|s| replica.watermarks(s).map(|w| (s.clone(), w)))
        .collect();
    let suspected = replica.suspected().cloned().collect();
    shared.published.publish(wms, suspected, replica.location());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(bytes: usize) -> Input {
        Input::Sent {
            to: ReplicaId::from("peer"),
            bytes,
        }
    }

    /// Writes queued after a backlog of replication work are taken first, and
    /// the backlog after them in its own order.
    #[tokio::test]
    async fn the_inbox_takes_clients_writes_before_replication() {
        let (writes, rest, mut inbox) = Inbox::new(16);
        for bytes in 1..=3 {
            rest.send(sent(bytes)).await.unwrap();
        }
        let (reply, _answer) = oneshot::channel();
        writes
            .send(Input::RegionsApplied {
                scope: ScopeId::global(),
                sequence: 7,
                reply,
            })
            .await
            .unwrap();
        assert!(matches!(
            inbox.recv().await,
            Some(Input::RegionsApplied { sequence: 7, .. })
        ));
        let order: Vec<usize> = std::iter::from_fn(|| match inbox.try_recv() {
            Some(Input::Sent { bytes, .. }) => Some(bytes),
            _ => None,
        })
        .collect();
        assert_eq!(order, vec![1, 2, 3]);
        // Both lanes closed and empty: the driver's inbox ends.
        drop((writes, rest));
        assert!(inbox.recv().await.is_none());
    }
}
