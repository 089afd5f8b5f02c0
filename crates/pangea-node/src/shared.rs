//! [`Shared`]: what the driver, the peer tasks and the request handlers of one
//! replica share, grouped by concern, each group owning its locks:
//!
//! - [`Deployed`]: the deployment in force, the files as declared, their texts and
//!   digest (a reload swaps them);
//! - [`Published`]: what the driver publishes every turn for the serving path and
//!   `/health` (watermarks, suspicions, location metadata, clock fence, readiness,
//!   store health); only the driver writes it;
//! - [`Intake`]: the caps, budgets and counts of what comes in (requests, frames,
//!   handshakes, connections);
//! - [`ResidencyCounts`]: restricted frames to or from replicas outside a policy.

use crate::{NodeConfig, clock, disk, driver, fault, lag, metrics, readiness};
use pangea_core::location::Location;
use pangea_core::{Limits, RowState, ScopeId, ScopeWatermarks, StorageError};
use pangea_store::Store;
use pangea_topology::{Deployment, RegionId, ReplicaId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use tokio::sync::{Semaphore, mpsc};

/// A read on a blocking thread that panicked (or was cancelled by the runtime
/// shutting down): an engine failure to the caller, who may ask another replica.
fn blocking_read_failed(e: tokio::task::JoinError) -> StorageError {
    StorageError::Io {
        doing: "reading on a blocking thread",
        source: pangea_core::EngineError::new(e),
    }
}

/// State shared by the driver, the peer tasks and the request handlers.
pub struct Shared {
    pub id: ReplicaId,
    pub region: RegionId,
    pub seed: u64,
    /// How this node was started: where to reload its files from.
    pub config: NodeConfig,
    pub core_limits: Limits,
    pub clock: Arc<clock::Clock>,
    /// The deployment's files and what is in force.
    pub deployed: Deployed,
    /// What the driver publishes for everyone else.
    pub published: Published,
    /// The store, shared with the driver's core; `None` while a failed store is
    /// being reopened (`disk`).
    store: RwLock<Option<Store>>,
    /// Free space against the reserve, and whether the store failed (`disk`).
    pub disk: Arc<disk::Disk>,
    /// The driver's inbox for everything but clients' writes: peers' frames,
    /// send reports, operators' requests, reloads.
    pub driver: mpsc::Sender<driver::Input>,
    /// Its lane for clients' writes and their waits for other regions, taken
    /// first ([`driver::Inbox`]).
    pub driver_writes: mpsc::Sender<driver::Input>,
    pub intake: Intake,
    /// The QUIC endpoint (peer links are started from it, also after a reload).
    pub endpoint: quinn::Endpoint,
    /// The main runtime, where peer links and request handlers run (the driver has
    /// its own).
    pub runtime: tokio::runtime::Handle,
    /// The live TLS state of the endpoint: reloaded on SIGHUP and by a poller; it
    /// closes accepted connections whose peer certificate stops verifying.
    pub tls: Arc<pangea_net::LiveTls>,
    /// Runtime fault injection (drills), when started with `fault_injection`.
    pub faults: Option<fault::FaultControl>,
    /// The emulated links (WAN emulation or fault injection), told of peers a
    /// reload adds.
    pub links: Option<Arc<fault::Links>>,
    pub metrics: Arc<metrics::NodeMetrics>,
    /// How long after their origin stamped them entries were applied here.
    pub apply_lag: lag::ApplyLag,
    pub residency: ResidencyCounts,
    /// Operator actions, refusals, merges and purges (`audit_log`).
    pub audit: crate::audit_log::AuditLog,
    /// Keeps the serving runtime polling while requests come (`serve_poll_us`).
    pub poller: Arc<crate::poll::Poller>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("id", &self.id)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// What [`Shared`] is made of beyond its groups' initial states.
pub(crate) struct Parts {
    pub id: ReplicaId,
    pub region: RegionId,
    pub seed: u64,
    pub config: NodeConfig,
    pub core_limits: Limits,
    pub clock: Arc<clock::Clock>,
    pub deployment: Arc<Deployment>,
    pub sources: Sources,
    pub location: Location,
    pub store: Store,
    pub disk: Arc<disk::Disk>,
    pub driver: mpsc::Sender<driver::Input>,
    pub driver_writes: mpsc::Sender<driver::Input>,
    pub endpoint: quinn::Endpoint,
    pub tls: Arc<pangea_net::LiveTls>,
    pub faults: Option<fault::FaultControl>,
    pub links: Option<Arc<fault::Links>>,
    pub audit: crate::audit_log::AuditLog,
}

impl Shared {
    pub(crate) fn new(p: Parts) -> Shared {
        Shared {
            intake: Intake::new(&p.config),
            poller: Arc::new(crate::poll::Poller::for_current_runtime(
                std::time::Duration::from_micros(p.config.serve_poll_us),
            )),
            deployed: Deployed::new(p.deployment, p.sources),
            published: Published::new(p.location),
            id: p.id,
            region: p.region,
            seed: p.seed,
            config: p.config,
            core_limits: p.core_limits,
            clock: p.clock,
            store: RwLock::new(Some(p.store)),
            disk: p.disk,
            driver: p.driver,
            driver_writes: p.driver_writes,
            endpoint: p.endpoint,
            runtime: tokio::runtime::Handle::current(),
            tls: p.tls,
            faults: p.faults,
            links: p.links,
            metrics: Arc::new(metrics::NodeMetrics::new()),
            apply_lag: lag::ApplyLag::default(),
            residency: ResidencyCounts::default(),
            audit: p.audit,
        }
    }

    /// Where the readiness gate stands (`readiness`).
    pub fn phase(&self) -> readiness::Phase {
        self.published.phase()
    }

    /// The deployment in force.
    pub fn deployment(&self) -> Arc<Deployment> {
        self.deployed.deployment()
    }

    /// The effective scope of a row (location metadata, else the placement file).
    pub fn scope_of(&self, table: &str, key: &[u8]) -> ScopeId {
        let d = self.deployment();
        self.published.with_location(|l| l.scope_of(&d, table, key))
    }

    /// Durable watermarks of `scope` (all origins at zero if none published yet).
    /// The driver publishes every scope its replica hosts at its first turn, and
    /// requests ask only for hosted scopes, so the empty value is made only in the
    /// first moments after start and is not worth keeping.
    pub fn watermarks_of(&self, scope: &ScopeId) -> Arc<PublishedWatermarks> {
        self.published.watermarks_of(scope)
    }

    /// A row for a point read: from the row cache on this thread, or, on a miss,
    /// from fjall on a blocking thread. A fjall read can wait tens of milliseconds
    /// while a flush or compaction installs its files (fjall holds its version lock
    /// across their syncs, and those wait for the disk behind the journal's
    /// fsyncs); on the serving thread it would hold up every request of the
    /// replica (the mixed load's read tail, docs/benchmarks.md), here only itself.
    pub(crate) async fn store_row(
        &self,
        table: &str,
        key: &[u8],
    ) -> Result<Option<Arc<pangea_store::CachedRow>>, StorageError> {
        let (store, miss) =
            match self.with_store(|s| Ok(s.cached_row(table, key).map_err(|m| (s.clone(), m))))? {
                Ok(row) => return Ok(Some(row)),
                Err(missed) => missed,
            };
        tokio::task::spawn_blocking(move || store.read_missed_row(miss))
            .await
            .unwrap_or_else(|e| Err(blocking_read_failed(e)))
    }

    pub(crate) fn scan(
        &self,
        table: &str,
        range: &pangea_core::BytesRange,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<(bytes::Bytes, RowState)>, StorageError> {
        use pangea_core::Storage;
        self.with_store(|s| s.scan_range(table, range, reverse, limit))
    }

    /// [`Shared::scan`] on a blocking thread (as [`Shared::store_row`]'s misses).
    pub(crate) async fn scan_off_thread(
        self: &Arc<Self>,
        table: String,
        range: pangea_core::BytesRange,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<(bytes::Bytes, RowState)>, StorageError> {
        let shared = self.clone();
        tokio::task::spawn_blocking(move || shared.scan(&table, &range, reverse, limit))
            .await
            .unwrap_or_else(|e| Err(blocking_read_failed(e)))
    }

    /// Runs `f` on the store, or fails while it is being reopened.
    fn with_store<T>(
        &self,
        f: impl FnOnce(&Store) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        match &*self.store.read().unwrap_or_else(|p| p.into_inner()) {
            Some(s) => f(s),
            None => Err(StorageError::Closed {
                replica: self.id.to_string(),
                state: self.disk.state().to_string(),
            }),
        }
    }

    /// A page of a change stream from the store's replication log
    /// (`pangea_core::changes::read`).
    pub(crate) fn read_changes(
        &self,
        streams: &[pangea_core::changes::Stream],
        from: &pangea_core::changes::Cursor,
        q: &pangea_core::changes::Query<'_>,
    ) -> Result<pangea_core::changes::Page, pangea_core::changes::ChangesError> {
        self.with_store(|s| Ok(pangea_core::changes::read(s, streams, from, q)))?
    }

    /// Puts a (re)opened store in place, or takes it away (`None`) so that it can
    /// be reopened: fjall opens a directory only once all its handles are gone.
    pub(crate) fn set_store(&self, store: Option<Store>) {
        *self.store.write().unwrap_or_else(|p| p.into_inner()) = store;
    }

    /// Refreshes the gauges derived from watermarks before an export.
    pub(crate) fn refresh_gauges(&self) {
        let now_ms = self.clock.now().wall_ms as f64;
        let secs = |ts: pangea_core::Timestamp| ((now_ms - ts.wall_ms() as f64) / 1e3).max(0.0);
        for (scope, wm) in self.published.watermarks() {
            self.metrics
                .set_watermark_age(scope.as_str(), secs(wm.low_watermark()));
            for (origin, w) in wm.iter() {
                self.metrics.set_replication_lag(
                    scope.as_str(),
                    origin.as_str(),
                    secs(w.timestamp),
                );
                self.metrics.set_watermark_sequence(
                    scope.as_str(),
                    origin.as_str(),
                    w.sequence as i64,
                );
            }
        }
        let intake = &self.intake;
        self.metrics.set_connections(
            "peer",
            intake.peer_connections.load(Ordering::Relaxed) as i64,
        );
        self.metrics.set_connections(
            "client",
            intake.client_connections.load(Ordering::Relaxed) as i64,
        );
    }
}

/// The deployment in force, the files as declared and their texts.
#[derive(Debug)]
pub struct Deployed {
    /// The deployment in force, and its generation: bumped by every reload, so
    /// answers derived from table schemas (`pangea_store::CachedRow::latest_encoded`,
    /// TTLs) know when they must be made again.
    in_force: RwLock<(Arc<Deployment>, u64)>,
    /// The deployment as the files declare it, before a reload pins rows at their
    /// current policy: the residency bound of placement moves and of the audit.
    files: RwLock<Arc<Deployment>>,
    /// The texts of those files and their digest, which every response announces
    /// and `DeploymentRequest` returns (clients follow changes with them).
    sources: RwLock<Arc<Sources>>,
    /// `sources`' digest, read by every response without a lock.
    sources_digest: AtomicU64,
}

impl Deployed {
    fn new(deployment: Arc<Deployment>, sources: Sources) -> Deployed {
        Deployed {
            in_force: RwLock::new((deployment.clone(), 0)),
            files: RwLock::new(deployment),
            sources_digest: AtomicU64::new(sources.digest),
            sources: RwLock::new(Arc::new(sources)),
        }
    }

    pub fn deployment(&self) -> Arc<Deployment> {
        self.deployment_and_generation().0
    }

    /// The deployment in force and its generation.
    pub fn deployment_and_generation(&self) -> (Arc<Deployment>, u64) {
        let d = self.in_force.read().unwrap_or_else(|p| p.into_inner());
        (d.0.clone(), d.1)
    }

    /// Replaces the deployment in force (after a validated reload).
    pub fn set_deployment(&self, d: Arc<Deployment>) {
        let mut w = self.in_force.write().unwrap_or_else(|p| p.into_inner());
        *w = (d, w.1 + 1);
    }

    /// The deployment as the files declare it.
    pub fn files(&self) -> Arc<Deployment> {
        self.files.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records newly loaded files (a validated reload), and re-reads their texts
    /// from where `config` names them.
    pub fn set_files(&self, d: Arc<Deployment>, config: &NodeConfig) {
        *self.files.write().unwrap_or_else(|p| p.into_inner()) = d;
        match Sources::read(config) {
            Ok(s) => {
                self.sources_digest.store(s.digest, Ordering::Relaxed);
                *self.sources.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(s);
            }
            // Clients keep the files they have until the next reload.
            Err(e) => tracing::warn!(error = %e, "re-reading the deployment's files failed"),
        }
    }

    pub fn sources(&self) -> Arc<Sources> {
        self.sources
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The files' digest, without a lock.
    pub fn sources_digest(&self) -> u64 {
        self.sources_digest.load(Ordering::Relaxed)
    }
}

/// A deployment's files as read from disk, and their digest
/// ([`pangea_topology::files_digest`]).
#[derive(Debug, Default)]
pub struct Sources {
    pub topology: String,
    pub placement: Option<String>,
    pub digest: u64,
}

impl Sources {
    /// Reads the files `config` names (those a reload just validated).
    pub fn read(config: &NodeConfig) -> std::io::Result<Sources> {
        let topology = std::fs::read_to_string(&config.topology)?;
        let placement = match &config.placement {
            Some(p) => Some(std::fs::read_to_string(p)?),
            None => None,
        };
        let digest = pangea_topology::files_digest(&topology, placement.as_deref());
        Ok(Sources {
            topology,
            placement,
            digest,
        })
    }
}

/// A scope's durable watermarks as the driver published them, with their wire form
/// made once per change rather than once per answer. Derefs to the watermarks.
#[derive(Debug)]
pub struct PublishedWatermarks {
    watermarks: ScopeWatermarks,
    /// `watermarks` encoded as a `pb::ScopeWatermarks`: what answers carry.
    pub wire: bytes::Bytes,
    /// Names `wire` to the clients holding it (`ServedBy.watermarks_digest`); a
    /// hash of it, never 0.
    pub digest: u64,
}

impl PublishedWatermarks {
    pub fn new(watermarks: ScopeWatermarks) -> PublishedWatermarks {
        use pangea_proto::Message as _;
        use std::hash::{Hash as _, Hasher as _};
        let wire = bytes::Bytes::from(watermarks.to_proto().encode_to_vec());
        let mut h = std::hash::DefaultHasher::new();
        wire.hash(&mut h);
        PublishedWatermarks {
            watermarks,
            wire,
            digest: h.finish().max(1),
        }
    }
}

impl std::ops::Deref for PublishedWatermarks {
    type Target = ScopeWatermarks;
    fn deref(&self) -> &ScopeWatermarks {
        &self.watermarks
    }
}

/// What the driver publishes every turn; everyone else only reads it.
#[derive(Debug)]
pub struct Published {
    /// Durable watermarks per scope, after every flush. Shared with the requests
    /// that answer with them, not copied per request; a scope's stay the same
    /// (`Arc`) over turns that did not change them.
    watermarks: RwLock<BTreeMap<ScopeId, Arc<PublishedWatermarks>>>,
    suspected: RwLock<BTreeSet<ReplicaId>>,
    /// Location metadata as the driver last applied it.
    location: RwLock<Location>,
    /// Why this replica's clock is fenced (`Replica::clock_fence`), if it is: then
    /// it refuses writes and reports unhealthy.
    clock_fence: RwLock<Option<String>>,
    /// Whether this replica has caught up since it started (`readiness`): until
    /// then it refuses reads and `/health` answers 503.
    readiness: RwLock<readiness::Phase>,
    /// False while the store is failed: the node refuses writes and reports
    /// unhealthy.
    healthy: AtomicBool,
    /// Woken when heartbeats arrive, which may carry the applied reports a write
    /// waiting for other regions waits for (`serve.rs`).
    heartbeats_heard: tokio::sync::Notify,
}

impl Published {
    fn new(location: Location) -> Published {
        Published {
            watermarks: RwLock::new(BTreeMap::new()),
            suspected: RwLock::new(BTreeSet::new()),
            location: RwLock::new(location),
            clock_fence: RwLock::new(None),
            readiness: RwLock::new(readiness::Phase::Listening),
            healthy: AtomicBool::new(true),
            heartbeats_heard: tokio::sync::Notify::new(),
        }
    }

    /// Durable watermarks of `scope` (all origins at zero if none published yet).
    /// The driver publishes every scope its replica hosts at its first turn, and
    /// requests ask only for hosted scopes, so the empty value is made only in the
    /// first moments after start and is not worth keeping.
    pub fn watermarks_of(&self, scope: &ScopeId) -> Arc<PublishedWatermarks> {
        self.watermarks
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(scope)
            .cloned()
            .unwrap_or_else(|| {
                Arc::new(PublishedWatermarks::new(ScopeWatermarks::new(
                    scope.clone(),
                )))
            })
    }

    /// Every scope's durable watermarks.
    pub fn watermarks(&self) -> BTreeMap<ScopeId, Arc<PublishedWatermarks>> {
        self.watermarks
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn suspected(&self) -> Vec<ReplicaId> {
        self.suspected
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// `f` of the location metadata as last applied.
    pub fn with_location<T>(&self, f: impl FnOnce(&Location) -> T) -> T {
        f(&self.location.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// The driver's turn: watermarks and suspicions replaced, location metadata
    /// brought level with the core's (only what changed since the last turn, or a
    /// whole copy when the core rebuilt it: a million entries are not compared or
    /// copied per turn).
    pub(crate) fn publish(
        &self,
        watermarks: BTreeMap<ScopeId, ScopeWatermarks>,
        suspected: BTreeSet<ReplicaId>,
        core: &Location,
    ) {
        let behind =
            self.with_location(|l| l.epoch() != core.epoch() || l.version() != core.version());
        if behind {
            self.location
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .follow(core);
        }
        // A scope's watermarks are encoded again only when they changed: most turns
        // change none, or one scope's. Read, then replaced, under two locks: the
        // driver is the only writer.
        let before = self.watermarks();
        let watermarks = watermarks
            .into_iter()
            .map(|(scope, wm)| {
                let kept = before.get(&scope).filter(|p| p.watermarks == wm).cloned();
                let published = kept.unwrap_or_else(|| Arc::new(PublishedWatermarks::new(wm)));
                (scope, published)
            })
            .collect();
        *self.watermarks.write().unwrap_or_else(|p| p.into_inner()) = watermarks;
        *self.suspected.write().unwrap_or_else(|p| p.into_inner()) = suspected;
    }

    pub fn clock_fence(&self) -> Option<String> {
        self.clock_fence
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Sets the fence; whether that changed it.
    pub(crate) fn set_clock_fence(&self, fence: Option<String>) -> bool {
        let mut f = self.clock_fence.write().unwrap_or_else(|p| p.into_inner());
        let changed = *f != fence;
        *f = fence;
        changed
    }

    pub fn phase(&self) -> readiness::Phase {
        self.readiness
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn set_phase(&self, phase: readiness::Phase) {
        *self.readiness.write().unwrap_or_else(|p| p.into_inner()) = phase;
    }

    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub(crate) fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
    }

    pub fn heartbeats_heard(&self) -> &tokio::sync::Notify {
        &self.heartbeats_heard
    }
}

/// The caps, budgets and counts of what comes in.
#[derive(Debug)]
pub struct Intake {
    /// Caps concurrent client requests (`client_requests_max`).
    pub requests: Arc<Semaphore>,
    /// Bytes of client frames being received, over all connections
    /// (`frame_budget_mib`; each connection also has its own).
    pub frame_budget: Arc<Semaphore>,
    /// Which connection attempts are taken on (Retry, caps): `pangea_net::admission`.
    pub admission: pangea_net::admission::Admission,
    /// Connection attempts retried or refused since the last log line (logged at
    /// most once per `ATTEMPTS_LOG_EVERY`).
    pub attempts_unlogged: std::sync::Mutex<BTreeMap<&'static str, u64>>,
    /// Requests being served, for draining at shutdown.
    pub inflight: Inflight,
    pub peer_connections: AtomicUsize,
    pub client_connections: AtomicUsize,
}

impl Intake {
    fn new(config: &NodeConfig) -> Intake {
        Intake {
            requests: Arc::new(Semaphore::new(config.client_requests_max)),
            frame_budget: pangea_net::FrameBudget::process(crate::mib(config.frame_budget_mib)),
            admission: pangea_net::admission::Admission::new(config.admission()),
            attempts_unlogged: Default::default(),
            inflight: Inflight::default(),
            peer_connections: AtomicUsize::new(0),
            client_connections: AtomicUsize::new(0),
        }
    }
}

/// Requests being served, for draining at shutdown.
#[derive(Debug, Default)]
pub struct Inflight(AtomicUsize);

#[derive(Debug)]
pub struct InflightGuard<'a>(&'a Inflight);

impl Inflight {
    pub fn enter(&self) -> InflightGuard<'_> {
        self.0.fetch_add(1, Ordering::SeqCst);
        InflightGuard(self)
    }

    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Residency audit counters: restricted-scope frames sent to, or refused from,
/// replicas outside the scope's policy.
#[derive(Debug, Default)]
pub struct ResidencyCounts {
    pub to_outsiders: AtomicU64,
    pub from_outsiders: AtomicU64,
}
