//! `pangea-client`: how ad-serving frontends read and write Pangea.
//!
//! A tokio driver of the routing of `pangea_core::read` and of the per-call state
//! machines of `pangea_core::frontend::call` (the simulator drives the very same
//! types): it keeps QUIC connections (mutual TLS) to replicas, measures round trips,
//! remembers the watermarks every response carries, does what a call decides
//! (hedge within a budget, fail over, race a watermark read's fallbacks), and turns a
//! deadline into an explicit error rather than a late or stale answer.
//!
//! ```no_run
//! # async fn demo() -> Result<(), pangea_client::Error> {
//! use pangea_client::{Client, ClientConfig, ReadOptions, Consistency};
//! let cluster = pangea_topology::cluster::ClusterFile::load("cluster.toml".as_ref()).unwrap();
//! let client = Client::connect(ClientConfig::from_cluster(&cluster, "eu-west-1", "frontend")?).await?;
//! let profile = client.get_profile("eu/4821", &ReadOptions::default()).await?;
//! println!("answered by {} ({})", profile.replica, profile.reason);
//! # Ok(()) }
//! ```
//!
//! Modules: [`error`] (the one error enum), [`options`] (per-call settings),
//! [`bulk`] (bulk loads of batch-built rows, what `pangea load` runs),
//! `transport` (connections and one request), `read` (a read's requests in
//! flight, driven by `ReadCall`), `trace` (spans per call and per attempt;
//! docs/client.md#traces).

mod batch;
pub mod bulk;
pub mod changes;
mod clock;
pub mod error;
pub mod options;
mod read;
mod trace;
mod transport;

pub use batch::{BATCH_BYTES_MAX, BATCH_ROWS_MAX};
pub use changes::{Change, ChangesFrom, ChangesPage};
pub use error::Error;
pub use options::{Ack, HedgePolicy, ReadOptions, ScanOptions, WriteOptions};
pub use pangea_core::filter::Pattern;
pub use pangea_core::read::{Consistency, Reason};
pub use pangea_core::{
    BytesRange, CellFilter, Mutation, ReadFilter, RowMutation, ScopeWatermarks, TimeRange, Token,
};
pub use pangea_net::Credential;
pub use pangea_proto::v1::{AdProfile, FrequencyCap, Row, Segment};

use bytes::Bytes;
use dashmap::DashMap;
use pangea_core::frontend::call::{self, Action, Outcome, Resend, WriteCall};
use pangea_core::frontend::{self, DOWN_FOR, PROBE_DOWN_FOR, PROBE_TIMEOUT, WATERMARK_REFRESH};
use pangea_core::location::Location;
use pangea_core::read::{Candidate, PeerView, ReadRequest, RouteTable, plan_read_routed};
use pangea_proto::Message;
use pangea_proto::v1 as pb;
use pangea_topology::cluster::ClusterFile;
use pangea_topology::shard::{GroupId, ProcessLayout};
use pangea_topology::{AppProfile, Deployment, RegionId, ReplicaId, ScopeId};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use trace::{AttemptKind, Op, Traced};
use tracing::Instrument as _;

/// The table, family and column typed profile helpers use.
pub const PROFILE_TABLE: &str = "ad_profiles";
pub const PROFILE_FAMILY: &str = "profile";
pub const PROFILE_COLUMN: &[u8] = b"p";
/// The counter family of frequency caps in `ad_profiles`: one counter per
/// campaign, its TTL the cap's window.
pub const IMPRESSIONS_FAMILY: &str = "impressions";

/// `_location` entries asked for in one request ([`Client::refresh_location`]).
const LOCATION_PAGE_ROWS: u32 = 1_000;
/// Most `_location` entries a client holds: about 540 MiB of memory at the
/// footprint measured (564 bytes an entry, docs/benchmarks.md).
pub const LOCATION_ENTRIES_MAX: usize = 1_000_000;

/// Everything `Client::connect` needs.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub deployment: Arc<Deployment>,
    /// Where each replica listens.
    pub addresses: BTreeMap<ReplicaId, SocketAddr>,
    /// The frontend's region.
    pub region: RegionId,
    /// The app profile it acts for (must match its certificate).
    pub app_profile: String,
    /// The cluster certificates directory.
    pub certs: PathBuf,
    /// The certificate this process presents, from `certs` (`clients/`,
    /// `operators/` or `loaders/<name>.pem`). It must hold that identity: a
    /// certificate of another kind or name is refused at connect and at every
    /// reload.
    pub credential: Credential,
    /// Delay this client's traffic by the topology's round trip to each replica
    /// (local clusters with emulated WAN: replicas do not delay their answers to
    /// clients, so the client's side carries the whole round trip).
    pub emulate_wan: bool,
    /// Defaults for every call.
    pub read: ReadOptions,
    /// Put this client's datagrams through a WAN emulator controlled from outside
    /// (tests and drills slow or cut a replica at runtime); `emulate_wan` fills in
    /// the topology's delays.
    pub wan: Option<pangea_net::wan::WanControl>,
    /// QUIC connections kept to each replica; each tokio task's calls keep to one
    /// of them, and tasks spread over them (see `transport`: 2, the default, keeps
    /// both sides busy where one would make requests move in waves). At least 1.
    pub connections_per_replica: usize,
    /// The deadline of operator calls (placement moves, audits, reloads, watermarks
    /// of one replica); `None`: each call's own (10 s, 60 s, 30 s, 2 s).
    pub operator_deadline: Option<Duration>,
    /// [`pangea_topology::files_digest`] of the files `deployment` came from (0:
    /// not known). A replica announcing another digest makes the client fetch
    /// its files and follow them.
    pub deployment_digest: u64,
}

/// [`ClientConfig::connections_per_replica`] by default.
pub const CONNECTIONS_PER_REPLICA: usize = 2;

impl ClientConfig {
    /// From a cluster file: addresses, topology, placement and certificates. Uses
    /// the `client-<app_profile>` certificate `pangea cluster up` issues (another
    /// one with [`Self::with_credential`]).
    pub fn from_cluster(
        cluster: &ClusterFile,
        region: &str,
        app_profile: &str,
    ) -> Result<ClientConfig, Error> {
        let deployment = Deployment::load(&cluster.topology, cluster.placement.as_deref())
            .map_err(|p| Error::InvalidInput(format!("cluster topology: {p}")))?;
        let read = |p: &std::path::Path| {
            std::fs::read_to_string(p)
                .map_err(|e| Error::InvalidInput(format!("{}: {e}", p.display())))
        };
        let placement_text = cluster.placement.as_deref().map(read).transpose()?;
        let deployment_digest =
            pangea_topology::files_digest(&read(&cluster.topology)?, placement_text.as_deref());
        if !deployment.topology.regions.contains_key(region) {
            return Err(Error::InvalidInput(format!(
                "region {region:?} is not in topology {:?}",
                deployment.topology.name
            )));
        }
        let mut addresses = BTreeMap::new();
        for r in &cluster.replicas {
            let addr = r.address.parse().map_err(|_| {
                Error::InvalidInput(format!("replica {}: bad address {:?}", r.id, r.address))
            })?;
            addresses.insert(ReplicaId::from(r.id.as_str()), addr);
        }
        Ok(ClientConfig {
            deployment: Arc::new(deployment),
            addresses,
            region: region.into(),
            app_profile: app_profile.to_owned(),
            certs: cluster.certs.clone(),
            credential: Credential::Client(format!("client-{app_profile}")),
            emulate_wan: cluster.emulate_wan,
            read: ReadOptions::default(),
            wan: None,
            connections_per_replica: CONNECTIONS_PER_REPLICA,
            operator_deadline: None,
            deployment_digest,
        })
    }

    /// Presents `credential` instead (an operator tool, a batch loader, another
    /// client name); its files are read from [`Self::certs`].
    #[must_use]
    pub fn with_credential(mut self, credential: Credential) -> Self {
        self.credential = credential;
        self
    }
}

/// An answer, and where it came from.
#[derive(Debug, Clone)]
pub struct Response<T> {
    pub value: T,
    /// The replica that answered.
    pub replica: ReplicaId,
    pub region: String,
    /// Why that replica: nearest, home, affinity, covered, origin fallback, hedge…
    pub reason: Reason,
    /// That replica's watermarks for the row's scope, when it sent them (or
    /// named the ones the client holds): shared with the client's copy, which
    /// most answers only confirm.
    pub watermarks: Option<Arc<ScopeWatermarks>>,
    pub latency: Duration,
    /// Requests sent for this call (more than one after hedging or fallback).
    pub attempts: u32,
}

/// A page of a prefix scan.
#[derive(Debug, Clone, Default)]
pub struct ScanPage {
    pub rows: Vec<Row>,
    /// Pass as `ScanOptions::resume_after` for the next page; empty when done.
    pub resume_key: Bytes,
}

/// Counters a frontend can export.
#[derive(Debug, Default)]
pub struct ClientStats {
    pub requests: AtomicU64,
    pub hedges: AtomicU64,
    pub fallbacks: AtomicU64,
    pub failovers: AtomicU64,
    pub not_covered: AtomicU64,
    /// Location refreshes that had to read every entry again (the first, after
    /// another replica answered, a deployment change, or a forgotten cursor).
    pub location_resets: AtomicU64,
    /// Location entries learned as changes since the cursor (not in a reset).
    pub location_updates: AtomicU64,
}

pub(crate) struct Inner {
    pub(crate) config: ClientConfig,
    /// The deployment in force and this client's app profile in it: the one it
    /// connected with until a replica announces other files, then theirs
    /// (`Client::follow_deployment`). A call takes a snapshot (an `Arc`) and
    /// keeps it to its end.
    current: std::sync::RwLock<Arc<Current>>,
    /// `current`'s digest, kept beside it: every answer compares the digest its
    /// replica serves with it, and an atomic read of a line that changes once a
    /// deployment takes no lock that the client's threads would pass between them.
    current_digest: AtomicU64,
    /// The last other deployment digest a replica announced, and that replica:
    /// the background task fetches its files (`Client::follow_deployment`).
    announced: std::sync::Mutex<Option<(ReplicaId, u64)>>,
    /// Digests whose files did not load here, not fetched again.
    refused_digests: std::sync::Mutex<Vec<u64>>,
    pub(crate) transport: transport::Transport,
    /// Round-trip EWMA per replica, in ms.
    rtt_ms: DashMap<ReplicaId, f64>,
    /// Replicas that failed recently, until when.
    down: DownSet,
    /// Last-known watermarks per replica and scope, from every response, with
    /// when they arrived.
    known: DashMap<ReplicaId, KnownOf>,
    /// Location metadata (`_location`), refreshed in the background: run-time
    /// placement of rows, their policy and home region. Updated in place with what
    /// changed; a call reads it while it plans (never across an await).
    location: std::sync::RwLock<Location>,
    /// Where the refresh of `location` stands (one refresh at a time).
    location_refresh: tokio::sync::Mutex<LocationRefresh>,
    /// This client's microsecond clock (`Inner::us`), which the hedger and the
    /// calls' state machines run on, and the wall clock read through it.
    clock: clock::Clock,
    hedger: std::sync::Mutex<frontend::Hedger>,
    /// Reads whose decisions are being recorded (`Client::record_reads`).
    recorder: Recorder,
    pub stats: ClientStats,
}

/// Who makes a read: the application, or the client's own location refresh.
#[derive(Clone, Copy)]
enum Caller<'a> {
    App,
    /// Asks `prefer` (the replica whose cursor it holds) first.
    Refresh {
        prefer: Option<&'a ReplicaId>,
    },
}

/// Records of reads' decisions, for replay (`Client::record_reads`).
#[derive(Debug, Default)]
struct Recorder {
    /// Reads still to record (checked on every read: one atomic load).
    left: std::sync::atomic::AtomicUsize,
    logs: std::sync::Mutex<Vec<frontend::call::ReadLog>>,
}

impl Recorder {
    /// Whether the read starting now is to be recorded (counts it).
    fn wants_one(&self) -> bool {
        self.left.load(Ordering::Relaxed) > 0
            && self
                .left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
    }

    fn keep(&self, log: frontend::call::ReadLog) {
        self.logs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(log);
    }
}

/// Where a client's refresh of its location metadata stands.
#[derive(Debug, Default)]
struct LocationRefresh {
    /// The digest of the deployment the entries were checked against.
    digest: u64,
    /// The cursor of the last answer (empty: none), and the replica that gave it.
    cursor: Bytes,
    replica: Option<ReplicaId>,
    /// A copy being built after a reset, until the answer says nothing more
    /// follows (then it replaces the one in use).
    building: Option<Location>,
}

/// The deployment a client routes by, its app profile in it, and the digest of
/// the files it came from (0: not known).
#[derive(Debug)]
pub(crate) struct Current {
    pub(crate) deployment: Arc<Deployment>,
    /// The deployment's shard groups over processes, worked out once.
    pub(crate) layout: ProcessLayout,
    pub(crate) profile: AppProfile,
    pub(crate) digest: u64,
    /// Each scope's routes from this client's region for its app profile, worked
    /// out once per deployment instead of on every read.
    pub(crate) routes: RouteTable,
}

impl Current {
    /// `deployment` as a client in `region` acting for `profile` routes by it.
    fn new(
        deployment: Arc<Deployment>,
        profile: AppProfile,
        region: &RegionId,
        digest: u64,
    ) -> Current {
        Current {
            layout: deployment.process_layout(),
            routes: RouteTable::new(&deployment, &profile, region),
            deployment,
            profile,
            digest,
        }
    }
}

/// What the client knows of one replica's watermarks.
#[derive(Debug, Default)]
struct KnownOf {
    scopes: BTreeMap<ScopeId, Known>,
    /// The digest of the watermarks its last answer sent in full, which requests
    /// name (`ClientRequest.known_watermarks`) so that the replica leaves them out
    /// while they still hold; 0: none.
    last_digest: u64,
}

/// A replica's watermarks for one scope, as its last answer gave them.
#[derive(Debug, Clone)]
struct Known {
    watermarks: Arc<ScopeWatermarks>,
    /// The replica's name for them (`ServedBy.watermarks_digest`); 0: unknown (a
    /// probe's answer).
    digest: u64,
    /// The client's wall clock when the answer arrived, ms.
    learned_ms: u64,
}

impl Inner {
    /// Keeps what `replica` said of a scope's watermarks at `now_ms` (wall clock):
    /// `digest` is the replica's name for them (0: not named).
    fn learn_watermarks(
        &self,
        replica: &ReplicaId,
        wm: &Arc<ScopeWatermarks>,
        digest: u64,
        now_ms: u64,
    ) {
        let mut of = self.known.entry(replica.clone()).or_default();
        if digest != 0 {
            of.last_digest = digest;
        }
        match of.scopes.get_mut(&wm.scope) {
            // Most answers repeat what the last one said: no copy then.
            Some(k) if *k.watermarks == **wm => {
                k.learned_ms = now_ms;
                if digest != 0 {
                    k.digest = digest;
                }
            }
            _ => {
                let known = Known {
                    watermarks: Arc::clone(wm),
                    digest,
                    learned_ms: now_ms,
                };
                let replaced = of.scopes.insert(wm.scope.clone(), known);
                // Unnamed ones (a probe's) replaced the ones requests name: name
                // none, so the next answer sends them in full.
                if replaced.is_some_and(|k| k.digest == of.last_digest) && digest == 0 {
                    of.last_digest = 0;
                }
            }
        }
    }

    /// The watermarks `replica` named by `digest` and left out of an answer at
    /// `now_ms`: unchanged since it sent them, so they are fresh as of now. `None`
    /// when the client no longer holds them.
    fn named_watermarks(
        &self,
        replica: &ReplicaId,
        digest: u64,
        now_ms: u64,
    ) -> Option<Arc<ScopeWatermarks>> {
        let mut of = self.known.get_mut(replica)?;
        let k = of.scopes.values_mut().find(|k| k.digest == digest)?;
        k.learned_ms = now_ms;
        Some(k.watermarks.clone())
    }

    /// The digest a request to `replica` names (`ClientRequest.known_watermarks`).
    fn known_digest(&self, replica: &ReplicaId) -> u64 {
        self.known.get(replica).map_or(0, |of| of.last_digest)
    }

    pub(crate) fn current(&self) -> Arc<Current> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// [`Inner::current`]'s digest, read in place (every answer checks it).
    fn current_digest(&self) -> u64 {
        self.current_digest.load(Ordering::Acquire)
    }
}

/// Replicas that failed recently, until when, and the latest of those times: a
/// read asks after every candidate it plans with, and while no replica is down
/// (nearly always) that is one atomic read of a line that seldom changes, not a
/// map look-up whose lock the client's threads would pass between them.
#[derive(Default)]
struct DownSet {
    until: DashMap<ReplicaId, Instant>,
    /// The latest `until` given, on the client's microsecond clock.
    latest_us: AtomicU64,
}

impl DownSet {
    fn mark(&self, clock: &clock::Clock, r: &ReplicaId, until: Instant) {
        self.until.insert(r.clone(), until);
        self.latest_us.fetch_max(clock.us(until), Ordering::Release);
    }

    fn clear(&self, r: &ReplicaId) {
        self.until.remove(r);
    }

    fn is_down(&self, clock: &clock::Clock, r: &ReplicaId, now: Instant) -> bool {
        clock.us(now) < self.latest_us.load(Ordering::Acquire)
            && self.until.get(r).is_some_and(|until| *until > now)
    }
}

/// What the shared routing code sees: the client's live state, looked up in place
/// (a request used to copy every replica's RTT, health and watermarks first, which
/// in a 20-replica deployment was most of a read's client-side work). Each look-up
/// holds a map guard only for itself.
struct LiveView<'a> {
    inner: &'a Inner,
    now: Instant,
    /// The same instant on the wall clock, ms.
    now_ms: u64,
}

impl PeerView for LiveView<'_> {
    fn rtt_ms(&self, replica: &ReplicaId) -> Option<f64> {
        self.inner.rtt_ms.get(replica).map(|e| *e)
    }
    fn is_down(&self, replica: &ReplicaId) -> bool {
        self.inner
            .down
            .is_down(&self.inner.clock, replica, self.now)
    }
    fn covers(&self, replica: &ReplicaId, token: &Token) -> bool {
        self.inner.known.get(replica).is_some_and(|of| {
            of.scopes
                .get(&token.scope)
                .is_some_and(|k| k.watermarks.covers(token))
        })
    }
    fn freshness(&self, replica: &ReplicaId, scope: &ScopeId) -> Option<pangea_core::Timestamp> {
        let of = self.inner.known.get(replica)?;
        let k = of.scopes.get(scope)?;
        let fresh = k.watermarks.freshness();
        Some(pangea_core::read::freshness_now(
            fresh,
            k.learned_ms,
            self.now_ms,
        ))
    }
}

/// A handle to Pangea. Cheap to clone; share one per process.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("region", &self.inner.config.region)
            .field("app_profile", &self.inner.config.app_profile)
            .finish()
    }
}

/// `start + d`, or a day after `start` for a `d` past what an `Instant` can hold
/// (a caller's deadline is theirs to choose).
fn deadline_after(start: Instant, d: Duration) -> Instant {
    start
        .checked_add(d)
        .unwrap_or_else(|| start + Duration::from_secs(86_400))
}

/// Whether a write whose outcome is unknown may be sent again: when the caller
/// says applying it twice is harmless, and it increments no counter (an
/// increment applied twice counts twice, whatever the caller says).
pub(crate) fn may_resend(opts: &WriteOptions, m: &RowMutation) -> bool {
    opts.resend_if_unknown
        && !m
            .mutations()
            .iter()
            .any(|x| matches!(x, Mutation::Increment { .. }))
}

impl Client {
    /// Connects: loads certificates, probes every replica the app profile may use
    /// (so the first reads already know the nearest), and starts refreshing
    /// watermarks in the background.
    pub async fn connect(config: ClientConfig) -> Result<Client, Error> {
        let profile = config
            .deployment
            .topology
            .app_profiles
            .get(&config.app_profile)
            .cloned()
            .ok_or_else(|| {
                Error::InvalidInput(format!("unknown app profile {:?}", config.app_profile))
            })?;
        let transport = transport::Transport::new(&config)?;
        let current = Current::new(
            config.deployment.clone(),
            profile,
            &config.region,
            config.deployment_digest,
        );
        let inner = Arc::new(Inner {
            current_digest: AtomicU64::new(current.digest),
            current: std::sync::RwLock::new(Arc::new(current)),
            announced: std::sync::Mutex::new(None),
            refused_digests: std::sync::Mutex::new(Vec::new()),
            transport,
            rtt_ms: DashMap::new(),
            down: DownSet::default(),
            known: DashMap::new(),
            location: std::sync::RwLock::new(Location::new()),
            location_refresh: tokio::sync::Mutex::new(LocationRefresh::default()),
            clock: clock::Clock::new(),
            hedger: std::sync::Mutex::new(frontend::Hedger::new(0)),
            recorder: Recorder::default(),
            stats: ClientStats::default(),
            config,
        });
        let client = Client { inner };
        client.probe_all(Duration::from_secs(2)).await;
        let _ = client.refresh_location().await;
        let weak = Arc::downgrade(&client.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(WATERMARK_REFRESH).await;
                let Some(inner) = weak.upgrade() else { return };
                let client = Client { inner };
                client.follow_deployment().await;
                client.probe_all(PROBE_TIMEOUT).await;
                let _ = client.refresh_location().await;
            }
        });
        Ok(client)
    }

    /// Takes up the files a replica announced (another digest than ours in its
    /// responses' `ServedBy.deployment`): fetches them from it
    /// (`DeploymentRequest`), checks their digest, loads them, learns the
    /// addresses of replicas they add and forgets those they remove, and routes by
    /// them from the next call on; calls in flight finish on the deployment they
    /// started with. Files that do not load (or drop this client's region or app
    /// profile) are refused, logged, and not fetched again. Runs in the background
    /// task, once a [`WATERMARK_REFRESH`] at most.
    async fn follow_deployment(&self) {
        let inner = &self.inner;
        let announced = inner
            .announced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some((replica, digest)) = announced else {
            return;
        };
        let refused = || {
            inner
                .refused_digests
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&digest)
        };
        if digest == inner.current().digest || refused() {
            return;
        }
        match self.fetch_deployment(&replica, digest).await {
            Ok(next) => {
                let before = inner.current();
                let gone: Vec<&ReplicaId> = before
                    .deployment
                    .topology
                    .replicas
                    .keys()
                    .filter(|r| !next.deployment.topology.replicas.contains_key(*r))
                    .collect();
                tracing::info!(
                    from = %replica,
                    replicas = next.deployment.topology.replicas.len(),
                    removed = gone.len(),
                    "following the deployment's new files"
                );
                inner.transport.learn_addresses(&next.deployment);
                for r in &gone {
                    inner.transport.forget(r);
                    inner.rtt_ms.remove(*r);
                    inner.known.remove(*r);
                }
                let digest = next.digest;
                *inner.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
                inner.current_digest.store(digest, Ordering::Release);
            }
            Err(e) => {
                tracing::warn!(from = %replica, error = %e, "not following announced files");
                if matches!(e, Error::InvalidInput(_)) {
                    inner
                        .refused_digests
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(digest);
                }
            }
        }
    }

    /// The files `replica` runs, loaded: the deployment they make and this
    /// client's app profile in it. `InvalidInput` when they do not load here.
    async fn fetch_deployment(&self, replica: &ReplicaId, digest: u64) -> Result<Current, Error> {
        let inner = &self.inner;
        let req = pb::ClientRequest {
            deadline_us: PROBE_TIMEOUT.as_micros() as u64,
            app_profile: inner.config.app_profile.clone(),
            traceparent: String::new(),
            known_watermarks: 0,
            request: Some(pb::client_request::Request::Deployment(
                pb::DeploymentRequest {},
            )),
        };
        let resp = tokio::time::timeout(PROBE_TIMEOUT, inner.transport.call(replica, &req))
            .await
            .map_err(|_| Error::Unavailable(format!("replica {replica}: no answer")))??;
        let files = match resp.response {
            Some(pb::client_response::Response::Deployment(f)) => f,
            Some(pb::client_response::Response::Error(e)) => {
                return Err(Error::from_wire(&e, replica));
            }
            other => return Err(Error::Internal(format!("unexpected response {other:?}"))),
        };
        let placement = (!files.placement.is_empty()).then_some(files.placement.as_str());
        let got = pangea_topology::files_digest(&files.topology, placement);
        if got != files.digest || got != digest {
            return Err(Error::Internal(format!(
                "replica {replica} sent files of digest {got:x}, announced {digest:x}"
            )));
        }
        let name = |what: &str| std::path::PathBuf::from(format!("{what} from replica {replica}"));
        let deployment = Deployment::parse(
            &name("topology"),
            &files.topology,
            placement
                .map(|p| (name("placement"), p))
                .as_ref()
                .map(|(n, p)| (n.as_path(), *p)),
        )
        .map_err(|p| Error::InvalidInput(p.to_string()))?;
        if !deployment
            .topology
            .regions
            .contains_key(&inner.config.region)
        {
            return Err(Error::InvalidInput(format!(
                "the new topology has no region {}",
                inner.config.region
            )));
        }
        let profile = deployment
            .topology
            .app_profiles
            .get(&inner.config.app_profile)
            .cloned()
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "the new topology has no app profile {:?}",
                    inner.config.app_profile
                ))
            })?;
        Ok(Current::new(
            Arc::new(deployment),
            profile,
            &inner.config.region,
            digest,
        ))
    }

    /// The deployment this client routes by now: the one it connected with, or
    /// the files a replica announced since (see `follow_deployment`).
    pub fn deployment(&self) -> Arc<Deployment> {
        self.inner.current().deployment.clone()
    }

    pub fn stats(&self) -> &ClientStats {
        &self.inner.stats
    }

    pub fn region(&self) -> &RegionId {
        &self.inner.config.region
    }

    /// The app profile this client acts for.
    pub fn app_profile(&self) -> &str {
        &self.inner.config.app_profile
    }

    /// Replicas this client may use at all (any row), for probing.
    fn usable(&self) -> Vec<ReplicaId> {
        let cur = self.inner.current();
        let d = &cur.deployment;
        pangea_core::read::usable(d, &cur.profile, &self.inner.config.region)
            .into_iter()
            .cloned()
            .collect()
    }

    /// Asks every usable replica for its watermarks: measures round trips and learns
    /// what each has applied.
    async fn probe_all(&self, timeout: Duration) {
        let mut set = JoinSet::new();
        for r in self.usable() {
            let inner = self.inner.clone();
            set.spawn(async move {
                let req = pb::ClientRequest {
                    deadline_us: timeout.as_micros() as u64,
                    app_profile: inner.config.app_profile.clone(),
                    traceparent: String::new(),
                    known_watermarks: 0,
                    request: Some(pb::client_request::Request::Watermarks(
                        pb::WatermarkRequest {
                            scope: String::new(),
                        },
                    )),
                };
                // Timed from when the request went out: a first probe also makes
                // the connection, and a handshake is not the replica's round trip.
                let sent = transport::Sent::default();
                let nothing = pb::ClientRequest::default();
                let call = inner.transport.call_noting(&r, &req, &nothing, &sent);
                if let Ok(Ok(resp)) = tokio::time::timeout(timeout, call).await {
                    let started = sent.at().unwrap_or_else(Instant::now);
                    inner.note_rtt(&r, started.elapsed());
                    if let Some(pb::client_response::Response::Watermarks(w)) = resp.response {
                        let now_ms = inner.wall_ms(Instant::now());
                        for s in &w.scopes {
                            let wm = Arc::new(ScopeWatermarks::from_proto(s));
                            inner.learn_watermarks(&r, &wm, 0, now_ms);
                        }
                    }
                    inner.down.clear(&r);
                } else {
                    // Until the next probe says otherwise.
                    inner.mark_down(&r, PROBE_DOWN_FOR);
                }
            });
        }
        while set.join_next().await.is_some() {}
    }

    /// Brings the client's location metadata up to date with the nearest
    /// replica's: only what changed since the last refresh
    /// (`LocationChangesRequest` with the replica's cursor), or — the first time,
    /// after another replica answered, or when the replica no longer remembers the
    /// cursor — every entry again, a page of 1,000 at a time, into a new copy that
    /// replaces the one in use once complete. Entries are checked against this
    /// client's deployment; at most [`LOCATION_ENTRIES_MAX`] are held (past that,
    /// new ones are left out and logged: their rows route by the placement file's
    /// rules, and a replica refuses a read or write its row's policy forbids).
    pub async fn refresh_location(&self) -> Result<(), Error> {
        let opts = ReadOptions {
            hedge: None,
            deadline: Duration::from_millis(500),
            ..Default::default()
        };
        let table = pangea_core::location::LOCATION_TABLE;
        // Only entries valid under this client's deployment route reads, as on the
        // replicas (docs/invariants.md, I12).
        let cur = self.inner.current();
        let d = &cur.deployment;
        let mut state = self.inner.location_refresh.lock().await;
        if state.digest != cur.digest {
            // Which entries are valid depends on the deployment: read them all again.
            *state = LocationRefresh {
                digest: cur.digest,
                ..Default::default()
            };
        }
        let mut left_out = 0;
        loop {
            let body = Arc::new(self.inner.request_body(
                pb::client_request::Request::LocationChanges(pb::LocationChangesRequest {
                    cursor: state.cursor.clone(),
                    limit: LOCATION_PAGE_ROWS,
                }),
            ));
            // Not through `read`, which refreshes location metadata on policy errors.
            let traced = Traced::refresh_location(table);
            let resp = self
                .read_once_preferring(
                    table,
                    b"",
                    &body,
                    &opts,
                    &traced,
                    Caller::Refresh {
                        prefer: state.replica.as_ref(),
                    },
                    Instant::now(),
                )
                .instrument(traced.span.clone())
                .await;
            traced.finish(&resp);
            let resp = resp?;
            // The cursor is that replica's: ask it again next time.
            state.replica = Some(resp.replica);
            let page = match resp.value {
                pb::client_response::Response::LocationChanges(p) => p,
                other => return Err(Error::Internal(format!("unexpected response {other:?}"))),
            };
            let stats = &self.inner.stats;
            if page.reset {
                state.building = Some(Location::new());
                stats.location_resets.fetch_add(1, Ordering::Relaxed);
            } else if state.building.is_none() {
                stats
                    .location_updates
                    .fetch_add(page.updates.len() as u64, Ordering::Relaxed);
            }
            let apply = |loc: &mut Location| {
                for u in page.updates {
                    let entry = u
                        .entry
                        .and_then(|e| {
                            pangea_core::location::LocationEntry::from_proto(&u.key, e).ok()
                        })
                        .filter(|e| e.check(d).is_ok());
                    let Some(nul) = u.key.iter().position(|&b| b == 0) else {
                        continue;
                    };
                    let Ok(t) = std::str::from_utf8(&u.key[..nul]) else {
                        continue;
                    };
                    let prefix = u.key.slice(nul + 1..);
                    if entry.is_some()
                        && loc.len() >= LOCATION_ENTRIES_MAX
                        && loc.get(t, &prefix).is_none()
                    {
                        left_out += 1;
                        continue;
                    }
                    loc.set(t.into(), prefix, entry);
                }
            };
            match state.building.as_mut() {
                Some(b) => apply(b),
                None => {
                    if let Ok(mut l) = self.inner.location.write() {
                        apply(&mut l);
                    }
                }
            }
            state.cursor = page.cursor;
            if !page.more {
                break;
            }
        }
        if let Some(complete) = state.building.take() {
            let old = self
                .inner
                .location
                .write()
                .map(|mut l| std::mem::replace(&mut *l, complete));
            // A million entries take a while to free: not under the lock.
            drop(old);
        }
        if left_out > 0 {
            tracing::error!(
                left_out,
                limit = LOCATION_ENTRIES_MAX,
                "location metadata past the client's limit: entries left out"
            );
        }
        Ok(())
    }

    /// After replicas refused a call's row: refreshes location metadata (waiting a
    /// little first from the second round on) and says whether to plan again —
    /// not past [`frontend::POLICY_REFRESH_ROUNDS`], the call's deadline, or a failed refresh.
    async fn refresh_after_refusal(
        &self,
        round: u32,
        started: Instant,
        deadline: Duration,
    ) -> bool {
        let Some(wait) = frontend::policy_refresh_wait(round) else {
            return false;
        };
        if !wait.is_zero() {
            if started.elapsed() + wait >= deadline {
                return false;
            }
            tokio::time::sleep(wait).await;
        }
        // The refusing replica may run newer files (a resize moved the row's
        // group to another process): take them up first.
        self.follow_deployment().await;
        // Within the call's deadline: a refresh may take its own 500 ms.
        let left = deadline.saturating_sub(started.elapsed());
        matches!(
            tokio::time::timeout(left, self.refresh_location()).await,
            Ok(Ok(_))
        ) && started.elapsed() < deadline
    }

    /// Records the decisions of the application's next `n` reads (what each was
    /// told and did, as `pangea_core::frontend::call::ReadLog`s, collected by
    /// [`Client::take_recorded_reads`]): [`ReadLog::replay`] runs such a read's
    /// state machine again without a network — a read's choices, reproduced in a
    /// test.
    ///
    /// [`ReadLog::replay`]: pangea_core::frontend::call::ReadLog::replay
    pub fn record_reads(&self, n: usize) {
        self.inner.recorder.left.store(n, Ordering::Relaxed);
    }

    /// The reads recorded since [`Client::record_reads`], in the order they ended.
    pub fn take_recorded_reads(&self) -> Vec<frontend::call::ReadLog> {
        let mut logs = self
            .inner
            .recorder
            .logs
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *logs)
    }

    /// The location metadata in use, read-locked: hold it only while planning.
    fn location_read(&self) -> std::sync::RwLockReadGuard<'_, Location> {
        self.inner
            .location
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Location metadata as this client last read it.
    pub fn location(&self) -> Location {
        self.inner
            .location
            .read()
            .map(|l| l.clone())
            .unwrap_or_default()
    }

    fn view(&self, now: Instant, now_ms: u64) -> LiveView<'_> {
        LiveView {
            inner: &self.inner,
            now,
            now_ms,
        }
    }

    /// Reads one row.
    pub async fn get(
        &self,
        table: &str,
        key: impl Into<Bytes>,
        opts: &ReadOptions,
    ) -> Result<Response<Option<Row>>, Error> {
        let key = key.into();
        let req = pb::client_request::Request::Get(pb::GetRequest {
            table: table.to_owned(),
            row_key: key.clone(),
            filter: Some(opts.filter.to_proto()),
            consistency: Some(options::consistency_to_proto(&opts.consistency)),
        });
        let r = self.read(Op::Get, table, &key, 1, req, opts).await?;
        r.map(|resp| match resp {
            pb::client_response::Response::Get(g) => {
                Ok(g.row.filter(|row| !row.families.is_empty()))
            }
            other => Err(Error::Internal(format!("unexpected response {other:?}"))),
        })
    }

    /// Reads several rows of one table (of one placement policy), in the order of `keys`.
    /// A replica answers as many rows as fit one response (4 MiB by default): the
    /// call then asks again for the rest, each request with the call's whole
    /// options, until every row is read. Where replicas run many processes, the
    /// keys are split by the processes hosting their shard groups and read side
    /// by side (docs/sharding.md). The response's replica, reason and watermarks
    /// are those of the first request; `latency` and `attempts` count them all.
    pub async fn get_many(
        &self,
        table: &str,
        keys: &[Bytes],
        opts: &ReadOptions,
    ) -> Result<Response<Vec<Row>>, Error> {
        let classes = {
            let cur = self.inner.current();
            let d = &cur.deployment;
            let layout = &cur.layout;
            let mut classes: Vec<(Vec<u32>, Vec<usize>)> = Vec::new();
            if layout.is_split() {
                for (i, key) in keys.iter().enumerate() {
                    let class = layout.class(d.group_of(table, key));
                    match classes.iter_mut().find(|(c, _)| *c == class) {
                        Some((_, at)) => at.push(i),
                        None => classes.push((class, vec![i])),
                    }
                }
                // A part is routed by its first key: not one of the system scope
                // (on every process) when the part has another.
                let system = d.system_scope();
                for (_, at) in &mut classes {
                    at.sort_by_key(|&i| d.scope_of(table, &keys[i]) == system);
                }
            }
            classes
        };
        if classes.is_empty() {
            return self.get_many_hosted(table, keys, opts).await;
        }
        let started = Instant::now();
        let calls = classes.iter().map(|(_, at)| {
            let part: Vec<Bytes> = at.iter().map(|&i| keys[i].clone()).collect();
            async move { self.get_many_hosted(table, &part, opts).await }
        });
        let answers = futures_util::future::try_join_all(calls).await?;
        let mut rows: Vec<Option<Row>> = (0..keys.len()).map(|_| None).collect();
        let (mut attempts, mut first) = (0, None);
        for ((_, at), answer) in classes.iter().zip(answers) {
            attempts += answer.attempts;
            let answer = answer.map(|got| {
                for (&i, row) in at.iter().zip(got) {
                    rows[i] = Some(row);
                }
                Ok(())
            })?;
            first.get_or_insert(answer);
        }
        let rows: Vec<Row> = rows.into_iter().flatten().collect();
        if rows.len() != keys.len() {
            return Err(Error::Internal(format!(
                "{} rows answered for {} keys",
                rows.len(),
                keys.len()
            )));
        }
        let Some(first) = first else {
            return Err(Error::Internal("get-many of no part".into()));
        };
        first.map(|()| Ok(rows)).map(|r| Response {
            latency: started.elapsed(),
            attempts,
            ..r
        })
    }

    /// [`Client::get_many`] of keys one process of every replica hosts.
    async fn get_many_hosted(
        &self,
        table: &str,
        keys: &[Bytes],
        opts: &ReadOptions,
    ) -> Result<Response<Vec<Row>>, Error> {
        let started = Instant::now();
        let mut rows: Vec<Row> = Vec::with_capacity(keys.len());
        let mut first: Option<Response<()>> = None;
        let mut attempts = 0;
        while rows.len() < keys.len() || first.is_none() {
            let rest = &keys[rows.len()..];
            let key = rest.first().cloned().unwrap_or_default();
            let req = pb::client_request::Request::GetMany(pb::GetManyRequest {
                table: table.to_owned(),
                row_keys: rest.to_vec(),
                filter: Some(opts.filter.to_proto()),
                consistency: Some(options::consistency_to_proto(&opts.consistency)),
                max_bytes: 0,
            });
            let r = self
                .read(Op::GetMany, table, &key, rest.len(), req, opts)
                .await?;
            attempts += r.attempts;
            let page = r.map(|resp| match resp {
                pb::client_response::Response::GetMany(g) => Ok(g.rows),
                other => Err(Error::Internal(format!("unexpected response {other:?}"))),
            })?;
            if page.value.len() > rest.len() || (page.value.is_empty() && !rest.is_empty()) {
                return Err(Error::Internal(format!(
                    "replica {} answered {} rows for {} keys",
                    page.replica,
                    page.value.len(),
                    rest.len()
                )));
            }
            let page = page.map(|got| {
                rows.extend(got);
                Ok(())
            })?;
            first.get_or_insert(page);
        }
        let first = first.expect("one request at least");
        first.map(|()| Ok(rows)).map(|r| Response {
            latency: started.elapsed(),
            attempts,
            ..r
        })
    }

    /// Rows whose key starts with `prefix` (and falls in [`ScanOptions::range`]),
    /// in key order or ([`ScanOptions::reverse`]) the reverse, filters applied by
    /// the replica. Where
    /// replicas run many processes and the prefix does not fix the partition
    /// key, one page is read from each process side by side and merged in key
    /// order (a row two of them answer is kept once); the page ends where the
    /// first of them would resume, so every row comes exactly once over the
    /// pages.
    pub async fn scan_prefix(
        &self,
        table: &str,
        prefix: impl Into<Bytes>,
        scan: &ScanOptions,
        opts: &ReadOptions,
    ) -> Result<Response<ScanPage>, Error> {
        let prefix = prefix.into();
        let routes: Vec<Vec<u8>> = {
            let cur = self.inner.current();
            let d = &cur.deployment;
            let layout = &cur.layout;
            let mut routes: Vec<(Vec<u32>, Vec<u8>)> = Vec::new();
            if layout.is_split() && d.prefix_group(table, &prefix).is_none() {
                // Group 0 last: in `global` it is the system scope, on every
                // process, so a key of it may be routed to any (and that
                // process answers for group 0 with the groups it hosts).
                let groups = d.topology.shard_groups;
                for g in (1..groups).chain([0]) {
                    let class = layout.class(GroupId(g));
                    if routes.iter().any(|(c, _)| *c == class) {
                        continue;
                    }
                    if let Some(key) = d.key_in_group(table, &prefix, GroupId(g)) {
                        routes.push((class, key));
                    }
                }
            }
            routes.into_iter().map(|(_, key)| key).collect()
        };
        if routes.len() <= 1 {
            return self.scan_hosted(table, &prefix, &prefix, scan, opts).await;
        }
        let started = Instant::now();
        let pages = futures_util::future::try_join_all(
            routes
                .iter()
                .map(|route| self.scan_hosted(table, &prefix, route, scan, opts)),
        )
        .await?;
        // Where the first process that has more would resume: every process's
        // rows up to it are all read (down to it, going down).
        let resume_keys = pages
            .iter()
            .map(|p| &p.value.resume_key)
            .filter(|k| !k.is_empty());
        let cut: Option<Bytes> = if scan.reverse {
            resume_keys.max().cloned()
        } else {
            resume_keys.min().cloned()
        };
        let before_cut = |key: &Bytes| {
            cut.as_ref()
                .is_none_or(|c| if scan.reverse { key >= c } else { key <= c })
        };
        let mut merged: BTreeMap<Bytes, Row> = BTreeMap::new();
        let mut attempts = 0;
        let mut first = None;
        for page in pages {
            attempts += page.attempts;
            let page = page.map(|p| {
                for row in p.rows {
                    if before_cut(&row.key) {
                        merged.entry(row.key.clone()).or_insert(row);
                    }
                }
                Ok(())
            })?;
            first.get_or_insert(page);
        }
        let Some(first) = first else {
            return Err(Error::Internal("scan of no route".into()));
        };
        let limit = match scan.limit as usize {
            0 => frontend::SCAN_ROWS_DEFAULT,
            n => n.min(frontend::SCAN_ROWS_MAX),
        };
        let mut rows: Vec<Row> = merged.into_values().collect();
        if scan.reverse {
            rows.reverse();
        }
        let mut resume_key = cut.unwrap_or_default();
        if rows.len() > limit {
            rows.truncate(limit);
            resume_key = rows.last().map(|r| r.key.clone()).unwrap_or_default();
        }
        first
            .map(|()| Ok(ScanPage { rows, resume_key }))
            .map(|r| Response {
                latency: started.elapsed(),
                attempts,
                ..r
            })
    }

    /// Keys that split `table`'s rows under `prefix` into about `parts` ranges of
    /// similar row counts, for dividing batch work among workers (as Bigtable's
    /// `SampleRowKeys`): a keys-only scan of a `fraction` row sample
    /// ([`ScanOptions::row_sample`]), every `sampled / parts`-th key. Worker `i`
    /// takes the keys from split `i - 1` (included; the prefix's first key for
    /// the first) to split `i` (excluded; the prefix's end for the last). Fewer
    /// splits than `parts - 1` when the sample holds fewer keys; a smaller
    /// fraction reads less, a larger one splits more evenly.
    pub async fn split_keys(
        &self,
        table: &str,
        prefix: impl Into<Bytes>,
        parts: usize,
        fraction: f64,
        opts: &ReadOptions,
    ) -> Result<Vec<Bytes>, Error> {
        let prefix = prefix.into();
        let mut scan = ScanOptions {
            limit: frontend::SCAN_ROWS_MAX as u32,
            row_sample: fraction,
            keys_only: true,
            ..Default::default()
        };
        let mut sampled = Vec::new();
        loop {
            let page = self
                .scan_prefix(table, prefix.clone(), &scan, opts)
                .await?
                .value;
            sampled.extend(page.rows.into_iter().map(|r| r.key));
            if page.resume_key.is_empty() {
                break;
            }
            scan.resume_after = page.resume_key;
        }
        let parts = parts.max(1);
        Ok((1..parts)
            .filter_map(|i| sampled.get(i * sampled.len() / parts).cloned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter(|k| Some(k) != sampled.first())
            .collect())
    }

    /// One page of a prefix scan from one process of a replica, routed by `route`
    /// (a key in the shard groups that process hosts; the prefix itself when it
    /// fixes one).
    async fn scan_hosted(
        &self,
        table: &str,
        prefix: &Bytes,
        route: &[u8],
        scan: &ScanOptions,
        opts: &ReadOptions,
    ) -> Result<Response<ScanPage>, Error> {
        let req = pb::client_request::Request::ScanPrefix(scan.request(
            table,
            prefix.clone(),
            &opts.filter,
            &opts.consistency,
        ));
        let r = self.read(Op::Scan, table, route, 1, req, opts).await?;
        r.map(|resp| match resp {
            pb::client_response::Response::ScanPrefix(s) => Ok(ScanPage {
                rows: s.rows,
                resume_key: s.resume_key,
            }),
            other => Err(Error::Internal(format!("unexpected response {other:?}"))),
        })
    }

    /// Applies an atomic row mutation at the nearest allowed replica, or at the
    /// row's affinity replica ([`WriteOptions::row_affinity`], or the app profile's
    /// `writes = "row-affinity"`); the token lets later
    /// reads demand to see it (`Consistency::Watermark`).
    pub async fn mutate(
        &self,
        mutation: RowMutation,
        opts: &WriteOptions,
    ) -> Result<Response<Token>, Error> {
        let traced = Traced::call(Op::Mutate, mutation.table(), mutation.row_key(), 1, "none");
        let result = self
            .mutate_traced(mutation, opts, &traced)
            .instrument(traced.span.clone())
            .await;
        traced.finish(&result);
        result
    }

    async fn mutate_traced(
        &self,
        mutation: RowMutation,
        opts: &WriteOptions,
        traced: &Traced,
    ) -> Result<Response<Token>, Error> {
        let started = Instant::now();
        let deadline = opts.deadline_or_default();
        let mut round = 0;
        loop {
            match self
                .mutate_once(&mutation, opts, traced, started, deadline)
                .await
            {
                // Our location metadata may be stale (a migration moved the row):
                // refresh it and plan again.
                Err(Error::PolicyForbids(m))
                    if self.refresh_after_refusal(round, started, deadline).await =>
                {
                    tracing::debug!(round, refused = %m, "location refreshed after a refusal");
                    round += 1;
                }
                other => return other,
            }
        }
    }

    /// The replicas that may take `mutation`, best first: the nearest allowed one,
    /// or the row's affinity replica ([`WriteOptions::row_affinity`], or the app
    /// profile's `writes = "row-affinity"`) then the nearest.
    fn write_plan(
        &self,
        cur: &Current,
        mutation: &RowMutation,
        opts: &WriteOptions,
        started: Instant,
        deadline: Duration,
    ) -> Result<pangea_core::read::ReadPlan, Error> {
        let d = &cur.deployment;
        let now_ms = self.inner.wall_ms(Instant::now());
        let view = self.view(started, now_ms);
        let req = ReadRequest {
            client_region: &self.inner.config.region,
            profile: &cur.profile,
            table: mutation.table(),
            key: mutation.row_key(),
            // Affinity writes are planned as affinity reads: the row's rendezvous
            // replica in the region first, the nearest after it.
            consistency: if opts
                .row_affinity
                .unwrap_or(cur.profile.writes == pangea_topology::WriteRouting::RowAffinity)
            {
                &Consistency::RowAffinity
            } else {
                &Consistency::Eventual
            },
            deadline: Some(deadline),
        };
        let (plan, migrating_to) = {
            let location = self.location_read();
            (
                plan_read_routed(d, &cur.routes, &location, &req, &view, now_ms),
                location
                    .migrating_scope(d, mutation.table(), mutation.row_key())
                    .cloned(),
            )
        };
        let mut plan = plan.map_err(|e| Error::PolicyForbids(e.to_string()))?;
        // During a migration only replicas of both policies take writes (the
        // process of each that hosts the row's group there).
        if let Some(b) = migrating_to {
            plan.primary.retain(|c| d.allowed(&c.replica, &b));
        }
        Ok(plan)
    }

    /// One plan of a write and its attempts; a policy refusal ends it.
    async fn mutate_once(
        &self,
        mutation: &RowMutation,
        opts: &WriteOptions,
        traced: &Traced,
        started: Instant,
        deadline: Duration,
    ) -> Result<Response<Token>, Error> {
        let cur = self.inner.current();
        let d = &cur.deployment;
        let plan = self.write_plan(&cur, mutation, opts, started, deadline)?;
        let body =
            self.inner
                .request_body(pb::client_request::Request::Mutate(pb::MutateRequest {
                    mutation: Some(mutation.to_proto()),
                    wait_regions: match opts.ack {
                        Ack::Regions(n) => n,
                        _ => 0,
                    },
                    wait_all_regions: opts.ack == Ack::AllRegions,
                }));
        // `WriteCall` decides: no hedge (a write is not idempotent across origins);
        // another replica only when this one certainly did not apply it, unless
        // the caller says applying it twice is harmless.
        let resend = if may_resend(opts, mutation) {
            Resend::IfUnknown
        } else {
            Resend::IfNotApplied
        };
        let mut call = WriteCall::new(plan.primary, self.inner.us(started), deadline, resend);
        let mut errors: Vec<Option<Error>> = Vec::new();
        while let Some(Action::Send(n)) = call.poll_action() {
            let a = call.attempt(n);
            let c = a.candidate.clone();
            // The replica is told its budget; the call waits a little longer for
            // the answer the replica gives at that budget.
            let now = Instant::now();
            let budget = self
                .inner
                .instant(a.since_us.saturating_add(call.budget(n).as_micros() as u64))
                .saturating_duration_since(now);
            let wait = self
                .inner
                .instant(a.until_us)
                .saturating_duration_since(now);
            let span = traced.attempt(d, &c, a.kind);
            let answer = self
                .inner
                .attempt(&c, &body, (budget, wait), trace::traceparent(&span))
                .await;
            let now = self.inner.us(Instant::now());
            let result = match answer {
                Some(result) => {
                    call.handle_reply(now, n, read::reply_of(&result));
                    result
                }
                None => {
                    // Its timer, set for `until_us`, fired.
                    call.handle_timeout(now.max(call.attempt(n).until_us));
                    Err(Error::DeadlineExceeded {
                        deadline: wait,
                        attempts: 1,
                    })
                }
            };
            trace::finish_attempt(span, &result);
            let lessons: Vec<_> = call.lessons().collect();
            for lesson in lessons {
                let replica = &call.attempt(lesson.attempt()).candidate.replica;
                self.inner.learn(replica, lesson);
            }
            match result {
                Ok((pb::client_response::Response::Mutate(m), served)) => {
                    let token = Token::decode(&m.token)
                        .map_err(|e| Error::Internal(format!("bad token from replica: {e}")))?;
                    return Ok(Response {
                        value: token,
                        replica: c.replica,
                        region: served.region,
                        reason: c.reason,
                        watermarks: served.watermarks,
                        latency: started.elapsed(),
                        attempts: n as u32 + 1,
                    });
                }
                Ok((other, _)) => {
                    return Err(Error::Internal(format!("unexpected response {other:?}")));
                }
                Err(e) => {
                    errors.resize(n + 1, None);
                    errors[n] = Some(e);
                }
            }
        }
        let attempts = call.attempts().len() as u32;
        let error_of = |n: usize| errors.get(n).cloned().flatten();
        Err(match call.outcome() {
            Some(Outcome::NoCandidate) => Error::Unavailable("no replica to write to".into()),
            Some(Outcome::Ambiguous { attempt }) => match error_of(attempt) {
                Some(e @ Error::Ambiguous { .. }) => e,
                e => Error::Ambiguous {
                    replica: call.attempt(attempt).candidate.replica.to_string(),
                    detail: match e {
                        Some(Error::DeadlineExceeded { deadline, .. }) => {
                            format!("no answer within {} ms", deadline.as_millis())
                        }
                        Some(e) => e.to_string(),
                        None => "no answer in time".to_owned(),
                    },
                },
            },
            Some(Outcome::Failed { attempt } | Outcome::LastError { attempt }) => {
                error_of(attempt).unwrap_or(Error::DeadlineExceeded { deadline, attempts })
            }
            _ => Error::DeadlineExceeded { deadline, attempts },
        })
    }

    /// The typed profile of `user_key` (table `ad_profiles`, family `profile`, column `p`).
    pub async fn get_profile(
        &self,
        user_key: &str,
        opts: &ReadOptions,
    ) -> Result<Response<Option<AdProfile>>, Error> {
        let r = self
            .get_cell(
                PROFILE_TABLE,
                Bytes::copy_from_slice(user_key.as_bytes()),
                PROFILE_FAMILY,
                Bytes::from_static(PROFILE_COLUMN),
                opts,
            )
            .await?;
        r.map(|cell| match cell {
            Some(value) => AdProfile::decode(value)
                .map(Some)
                .map_err(|e| Error::Internal(format!("stored profile does not decode: {e}"))),
            None => Ok(None),
        })
    }

    /// The latest value of one cell of a row (`None`: no such cell).
    async fn get_cell(
        &self,
        table: &str,
        key: Bytes,
        family: &str,
        column: Bytes,
        opts: &ReadOptions,
    ) -> Result<Response<Option<Bytes>>, Error> {
        let mut opts = opts.clone();
        opts.filter = ReadFilter {
            columns: vec![(family.into(), column)],
            ..Default::default()
        };
        let r = self.get(table, key, &opts).await?;
        r.map(|row| {
            Ok(row
                .iter()
                .flat_map(|r| r.families.iter())
                .flat_map(|f| f.cells.iter())
                .next()
                .map(|c| c.value.clone()))
        })
    }

    /// Writes the typed profile of `user_key`.
    pub async fn put_profile(
        &self,
        user_key: &str,
        profile: &AdProfile,
        opts: &WriteOptions,
    ) -> Result<Response<Token>, Error> {
        let m = Mutation::SetCell {
            family: PROFILE_FAMILY.into(),
            column: Bytes::from_static(PROFILE_COLUMN),
            value: Bytes::from(profile.encode_to_vec()),
        };
        let mutation = RowMutation::new(
            PROFILE_TABLE,
            user_key.to_owned(),
            vec![m],
            &pangea_core::Limits::default(),
        )?;
        self.mutate(mutation, opts).await
    }

    /// Adds `delta` to the counter `family`:`column` of row `key` (a family of
    /// `type = "counter"` in the placement file). Increments from every region
    /// all count, whatever their order (docs/client.md, Counters). An increment
    /// is never resent when whether it was applied is unknown (it would count
    /// twice): such a failure is `Error::Ambiguous`, whatever
    /// [`WriteOptions::resend_if_unknown`] says.
    pub async fn increment(
        &self,
        table: &str,
        key: impl Into<Bytes>,
        family: &str,
        column: impl Into<Bytes>,
        delta: i64,
        opts: &WriteOptions,
    ) -> Result<Response<Token>, Error> {
        let m = Mutation::Increment {
            family: family.into(),
            column: column.into(),
            delta,
        };
        let mutation = RowMutation::new(table, key, vec![m], &pangea_core::Limits::default())?;
        self.mutate(mutation, opts).await
    }

    /// The value of counter `family`:`column` of row `key` (0 when nothing was
    /// ever counted, or all of it expired or was deleted).
    pub async fn get_counter(
        &self,
        table: &str,
        key: impl Into<Bytes>,
        family: &str,
        column: impl Into<Bytes>,
        opts: &ReadOptions,
    ) -> Result<Response<i64>, Error> {
        let r = self
            .get_cell(table, key.into(), family, column.into(), opts)
            .await?;
        r.map(|cell| Ok(cell.map_or(0, |v| pangea_core::row::count_of(&v))))
    }

    /// Counts one impression of `campaign_id` to `user_key`: +1 to its counter in
    /// the `impressions` family of `ad_profiles` (a counter family whose TTL is
    /// the frequency-cap window: docs/client.md, Frequency caps).
    pub async fn count_impression(
        &self,
        user_key: &str,
        campaign_id: &str,
        opts: &WriteOptions,
    ) -> Result<Response<Token>, Error> {
        self.increment(
            PROFILE_TABLE,
            user_key.to_owned(),
            IMPRESSIONS_FAMILY,
            campaign_id.to_owned(),
            1,
            opts,
        )
        .await
    }

    /// Impressions of `campaign_id` to `user_key` within the window (the
    /// `impressions` family's TTL), counted in every region.
    pub async fn impressions(
        &self,
        user_key: &str,
        campaign_id: &str,
        opts: &ReadOptions,
    ) -> Result<Response<i64>, Error> {
        self.get_counter(
            PROFILE_TABLE,
            user_key.to_owned(),
            IMPRESSIONS_FAMILY,
            campaign_id.to_owned(),
            opts,
        )
        .await
    }

    /// Starts moving the rows of `table` under `prefix` to placement policy `to`
    /// (optionally with a new home region), on a replica of both the current and the
    /// new policy. Returns that replica and the job id; `jobs` reports progress.
    pub async fn placement_move(
        &self,
        table: &str,
        prefix: &[u8],
        to: &str,
        home: Option<&str>,
    ) -> Result<(ReplicaId, String), Error> {
        // The runner must be in the prefix's current policy: a cached location from
        // before a move that just finished would pick a replica of the old one. Best
        // effort: if the refresh fails, the cache decides and the runner double-checks.
        if let Err(e) = self.refresh_location().await {
            tracing::debug!(error = %e, "location refresh before a placement move failed");
        }
        let cur = self.inner.current();
        let d = &cur.deployment;
        // The prefix's policy (its scope names the prefix's shard group too, which
        // says nothing about the rows under it): the runner is a process 0.
        let from = ScopeId::from(self.location_read().scope_of(d, table, prefix).policy());
        let to_scope = ScopeId::from(to);
        let mut runners: Vec<&ReplicaId> = d
            .topology
            .replicas
            .values()
            .filter(|r| {
                r.role.stores_rows() && d.allowed(&r.id, &from) && d.allowed(&r.id, &to_scope)
            })
            .map(|r| &r.id)
            .collect();
        runners.sort_by(|a, b| {
            let (ra, rb) = (
                self.inner.rtt_ms.get(*a).map_or(f64::MAX, |e| *e),
                self.inner.rtt_ms.get(*b).map_or(f64::MAX, |e| *e),
            );
            ra.total_cmp(&rb)
        });
        let runner = runners.first().copied().cloned().ok_or_else(|| {
            Error::PolicyForbids(format!("no replica is in both policies {from:?} and {to:?}; move through \"global\" in two steps"))
        })?;
        let req = pb::ClientRequest {
            deadline_us: self.operator_deadline_us(10_000_000),
            app_profile: self.inner.config.app_profile.clone(),
            traceparent: String::new(),
            known_watermarks: 0,
            request: Some(pb::client_request::Request::PlacementMove(
                pb::PlacementMoveRequest {
                    table: table.to_owned(),
                    prefix: Bytes::copy_from_slice(prefix),
                    to_policy: to.to_owned(),
                    home_region: home.unwrap_or_default().to_owned(),
                },
            )),
        };
        match self.inner.transport.call(&runner, &req).await?.response {
            Some(pb::client_response::Response::PlacementMove(m)) => Ok((runner, m.job_id)),
            Some(pb::client_response::Response::Error(e)) => Err(Error::from_wire(&e, &runner)),
            other => Err(Error::Internal(format!("unexpected response {other:?}"))),
        }
    }

    /// Every placement migration job (from the `_jobs` table, as the nearest replica
    /// has it).
    pub async fn jobs(&self) -> Result<Vec<pb::MigrationJob>, Error> {
        let scan = ScanOptions {
            limit: 1_000,
            ..Default::default()
        };
        let opts = ReadOptions {
            hedge: None,
            deadline: Duration::from_secs(2),
            ..Default::default()
        };
        let page = self
            .scan_prefix(
                pangea_core::location::JOBS_TABLE,
                Bytes::new(),
                &scan,
                &opts,
            )
            .await?;
        Ok(page
            .value
            .rows
            .iter()
            .filter_map(|r| r.families.iter().flat_map(|f| f.cells.iter()).next())
            .filter_map(|c| pb::MigrationJob::decode(c.value.clone()).ok())
            .collect())
    }

    /// One replica's residency audit of its own store.
    pub async fn audit(&self, replica: &ReplicaId) -> Result<pb::AuditResponse, Error> {
        let req = pb::ClientRequest {
            deadline_us: self.operator_deadline_us(60_000_000),
            app_profile: self.inner.config.app_profile.clone(),
            traceparent: String::new(),
            known_watermarks: 0,
            request: Some(pb::client_request::Request::Audit(pb::AuditRequest {})),
        };
        match self.inner.transport.call(replica, &req).await?.response {
            Some(pb::client_response::Response::Audit(a)) => Ok(a),
            Some(pb::client_response::Response::Error(e)) => Err(Error::from_wire(&e, replica)),
            other => Err(Error::Internal(format!("unexpected response {other:?}"))),
        }
    }

    /// The deadline of an operator call, in µs: the configured one, else `default`.
    fn operator_deadline_us(&self, default: u64) -> u64 {
        self.inner
            .config
            .operator_deadline
            .map_or(default, |d| d.as_micros().try_into().unwrap_or(u64::MAX))
    }

    /// Asks `replica` to re-read its topology, placement and certificate files (an
    /// operator certificate is needed). Returns the changes it applied, one line
    /// each; an invalid or refused file is an error that says why.
    pub async fn reload(&self, replica: &ReplicaId) -> Result<Vec<String>, Error> {
        let req = pb::ClientRequest {
            deadline_us: self.operator_deadline_us(30_000_000),
            app_profile: self.inner.config.app_profile.clone(),
            traceparent: String::new(),
            known_watermarks: 0,
            request: Some(pb::client_request::Request::Reload(pb::ReloadRequest {})),
        };
        match self.inner.transport.call(replica, &req).await?.response {
            Some(pb::client_response::Response::Reload(r)) => Ok(r.changes),
            Some(pb::client_response::Response::Error(e)) => Err(Error::from_wire(&e, replica)),
            other => Err(Error::Internal(format!("unexpected response {other:?}"))),
        }
    }

    /// One page of a prefix scan answered by `replica` from its own store, through
    /// `filter`: no routing, hedging or fallback, eventual consistency. For
    /// operators, checkers comparing what each replica holds and backups;
    /// frontends use [`Client::scan_prefix`].
    pub async fn scan_at(
        &self,
        replica: &ReplicaId,
        table: &str,
        prefix: impl Into<Bytes>,
        scan: &ScanOptions,
        filter: &ReadFilter,
        deadline: Duration,
    ) -> Result<ScanPage, Error> {
        let req = pb::ClientRequest {
            deadline_us: deadline.as_micros() as u64,
            app_profile: self.inner.config.app_profile.clone(),
            traceparent: String::new(),
            known_watermarks: 0,
            request: Some(pb::client_request::Request::ScanPrefix(scan.request(
                table,
                prefix.into(),
                filter,
                &Consistency::Eventual,
            ))),
        };
        let call = self.inner.transport.call(replica, &req);
        match tokio::time::timeout(deadline, call).await {
            Err(_) => Err(Error::DeadlineExceeded {
                deadline,
                attempts: 1,
            }),
            Ok(resp) => match resp?.response {
                Some(pb::client_response::Response::ScanPrefix(s)) => Ok(ScanPage {
                    rows: s.rows,
                    resume_key: s.resume_key,
                }),
                Some(pb::client_response::Response::Error(e)) => Err(Error::from_wire(&e, replica)),
                other => Err(Error::Internal(format!("unexpected response {other:?}"))),
            },
        }
    }

    /// Watermarks of one replica, all scopes.
    pub async fn watermarks(&self, replica: &ReplicaId) -> Result<Vec<ScopeWatermarks>, Error> {
        let req = pb::ClientRequest {
            deadline_us: self.operator_deadline_us(2_000_000),
            app_profile: self.inner.config.app_profile.clone(),
            traceparent: String::new(),
            known_watermarks: 0,
            request: Some(pb::client_request::Request::Watermarks(
                pb::WatermarkRequest {
                    scope: String::new(),
                },
            )),
        };
        let resp = self.inner.transport.call(replica, &req).await?;
        match resp.response {
            Some(pb::client_response::Response::Watermarks(w)) => {
                Ok(w.scopes.iter().map(ScopeWatermarks::from_proto).collect())
            }
            Some(pb::client_response::Response::Error(e)) => Err(Error::from_wire(&e, replica)),
            other => Err(Error::Internal(format!("unexpected response {other:?}"))),
        }
    }

    /// One read: plan with the shared routing code, then ask, hedge, fall back.
    /// `key`: the row key, the first of a get-many, or a scan's prefix (for its span).
    async fn read(
        &self,
        op: Op,
        table: &str,
        key: &[u8],
        keys: usize,
        body: pb::client_request::Request,
        opts: &ReadOptions,
    ) -> Result<Response<pb::client_response::Response>, Error> {
        self.inner.stats.requests.fetch_add(1, Ordering::Relaxed);
        let traced = Traced::call(op, table, key, keys, trace::mode_name(&opts.consistency));
        let started = Instant::now();
        let body = Arc::new(self.inner.request_body(body));
        let result = async {
            let mut round = 0;
            // Every round of planning shares the call's one deadline.
            let mut left = std::borrow::Cow::Borrowed(opts);
            // When this round starts: the first plans at the call's start.
            let mut at = started;
            loop {
                if round > 0 {
                    at = Instant::now();
                    let deadline = opts
                        .deadline
                        .saturating_sub(at.saturating_duration_since(started));
                    left.to_mut().deadline = deadline;
                }
                match self.read_once(table, key, &body, &left, &traced, at).await {
                    // A replica refused the row: our location metadata may be stale
                    // (rows moved). Refresh it and plan again.
                    Err(Error::PolicyForbids(m))
                        if !table.starts_with('_')
                            && self
                                .refresh_after_refusal(round, started, opts.deadline)
                                .await =>
                    {
                        tracing::debug!(round, refused = %m, "location refreshed after a refusal");
                        round += 1;
                    }
                    Err(Error::DeadlineExceeded { attempts, .. }) => {
                        return Err(Error::DeadlineExceeded {
                            deadline: opts.deadline,
                            attempts,
                        });
                    }
                    other => return other,
                }
            }
        }
        .instrument(traced.span.clone())
        .await;
        traced.finish(&result);
        result
    }

    /// One plan of a read, made at `started` (a clock reading just taken).
    async fn read_once(
        &self,
        table: &str,
        key: &[u8],
        body: &Arc<pb::ClientRequest>,
        opts: &ReadOptions,
        traced: &Traced,
        started: Instant,
    ) -> Result<Response<pb::client_response::Response>, Error> {
        self.read_once_preferring(table, key, body, opts, traced, Caller::App, started)
            .await
    }

    /// [`Client::read_once`] for `caller`: a location refresh asks the replica
    /// whose cursor it holds first when it is one of the candidates, and is never
    /// recorded (`Client::record_reads` counts the application's reads).
    /// `started`: a clock reading just taken, the call's one before its answer:
    /// health, deadline and hedge timer all count from it.
    #[allow(clippy::too_many_arguments)] // the read's parts, each needed once
    async fn read_once_preferring(
        &self,
        table: &str,
        key: &[u8],
        body: &Arc<pb::ClientRequest>,
        opts: &ReadOptions,
        traced: &Traced,
        caller: Caller<'_>,
        started: Instant,
    ) -> Result<Response<pb::client_response::Response>, Error> {
        let cur = self.inner.current();
        let d = &cur.deployment;
        let now_ms = self.inner.wall_ms(started);
        let view = self.view(started, now_ms);
        let req = ReadRequest {
            client_region: &self.inner.config.region,
            profile: &cur.profile,
            table,
            key,
            consistency: &opts.consistency,
            deadline: Some(opts.deadline),
        };
        let mut plan = plan_read_routed(d, &cur.routes, &self.location_read(), &req, &view, now_ms)
            .map_err(|e| Error::PolicyForbids(e.to_string()))?;
        let (prefer, record) = match caller {
            Caller::App => (None, self.inner.recorder.wants_one()),
            Caller::Refresh { prefer } => (prefer, false),
        };
        if let Some(i) = prefer.and_then(|p| plan.primary.iter().position(|c| &c.replica == p)) {
            let c = plan.primary.remove(i);
            plan.primary.insert(0, c);
        }
        read::run(&self.inner, d, plan, body, started, opts, traced, record).await
    }
}

impl<T> Response<T> {
    fn map<U>(self, f: impl FnOnce(T) -> Result<U, Error>) -> Result<Response<U>, Error> {
        Ok(Response {
            value: f(self.value)?,
            replica: self.replica,
            region: self.region,
            reason: self.reason,
            watermarks: self.watermarks,
            latency: self.latency,
            attempts: self.attempts,
        })
    }
}

/// What a replica said besides the answer.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    pub region: String,
    pub watermarks: Option<Arc<ScopeWatermarks>>,
    /// When the answer was in.
    pub at: Instant,
}

impl Inner {
    /// `at` on this client's microsecond clock.
    pub(crate) fn us(&self, at: Instant) -> u64 {
        self.clock.us(at)
    }

    /// The instant `us` on this client's microsecond clock names.
    pub(crate) fn instant(&self, us: u64) -> Instant {
        self.clock.instant(us)
    }

    /// The wall clock at `at` (an instant read lately), ms since the Unix epoch.
    pub(crate) fn wall_ms(&self, at: Instant) -> u64 {
        self.clock.wall_ms(at)
    }

    pub(crate) fn hedger(&self) -> std::sync::MutexGuard<'_, frontend::Hedger> {
        self.hedger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `r` is taken for down for `d` from now.
    pub(crate) fn mark_down(&self, r: &ReplicaId, d: Duration) {
        self.down.mark(&self.clock, r, Instant::now() + d);
    }

    fn note_rtt(&self, r: &ReplicaId, d: Duration) {
        let ms = d.as_secs_f64() * 1e3;
        // A replica already known is updated in place, with no copy of its id.
        if let Some(mut e) = self.rtt_ms.get_mut(r) {
            *e = frontend::rtt_ewma(Some(*e), ms);
            return;
        }
        let mut e = self.rtt_ms.entry(r.clone()).or_insert(ms);
        *e = frontend::rtt_ewma(Some(*e), ms);
    }

    /// A request to `r` has been outstanding this long and lost the race: raise its
    /// estimate toward that.
    fn note_slower(&self, r: &ReplicaId, at_least: Duration) {
        let ms = at_least.as_secs_f64() * 1e3;
        if let Some(mut e) = self.rtt_ms.get_mut(r)
            && let Some(raised) = frontend::rtt_raised(*e, ms)
        {
            *e = raised;
        }
    }

    /// A request to `r` got no answer in `waited`: gone (marked down, its
    /// connection dropped: a killed process keeps a QUIC connection open until its
    /// idle timeout), or slower than its estimate ([`frontend::after_silence`],
    /// judged on the estimate as it was).
    fn no_answer(&self, r: &ReplicaId, waited: Duration) {
        let rtt_ms = self.rtt_ms.get(r).map(|e| *e);
        match frontend::after_silence(rtt_ms, waited.as_secs_f64() * 1e3) {
            frontend::Silence::Gone => {
                self.mark_down(r, DOWN_FOR);
                self.transport.forget(r);
            }
            frontend::Silence::Slower(raised) => {
                if let Some(mut e) = self.rtt_ms.get_mut(r) {
                    *e = raised;
                }
            }
            frontend::Silence::AsExpected => {}
        }
    }

    /// What a call learned about `r` ([`call::Lesson`]); following a request
    /// after its call ended is the read driver's (`read::learn`).
    pub(crate) fn learn(&self, r: &ReplicaId, lesson: call::Lesson) {
        match lesson {
            call::Lesson::Slower { out_us, .. } => {
                self.note_slower(r, Duration::from_micros(out_us))
            }
            call::Lesson::NoAnswer { waited_us, .. } => {
                self.no_answer(r, Duration::from_micros(waited_us))
            }
            call::Lesson::Follow { .. } => {}
        }
    }

    /// One request to one candidate, which is given `budget`, waited for `wait`
    /// (at least `budget`); learns from the answer. `None`: no answer in `wait`
    /// after the request went out (the call's timeout, which teaches silence).
    pub(crate) async fn attempt(
        &self,
        c: &Candidate,
        body: &pb::ClientRequest,
        (budget, wait): (Duration, Duration),
        traceparent: String,
    ) -> Option<Result<(pb::client_response::Response, Served), Error>> {
        let since = Instant::now();
        let deadline_at = deadline_after(since, budget);
        let wait_until = deadline_after(since, wait.max(budget));
        let sent = transport::Sent::until(deadline_at, since);
        let ask = self.ask(c, body, since, deadline_at, traceparent, &sent);
        match tokio::time::timeout_at(wait_until.into(), ask).await {
            Ok(result) => Some(result),
            // Still connecting: nothing reached the replica.
            Err(_) if sent.at().is_none() => {
                self.mark_down(&c.replica, DOWN_FOR);
                Some(Err(Error::Unavailable(format!(
                    "replica {}: not connected within {budget:?}",
                    c.replica
                ))))
            }
            Err(_) => None,
        }
    }

    /// The part of a call's request every attempt shares: the app profile and
    /// the request itself ([`Inner::ask`] adds each attempt's own).
    pub(crate) fn request_body(&self, request: pb::client_request::Request) -> pb::ClientRequest {
        pb::ClientRequest {
            app_profile: self.config.app_profile.clone(),
            request: Some(request),
            ..Default::default()
        }
    }

    /// One request to one candidate, sent at `since`, for an answer by `deadline_at`
    /// (which the replica is told; the caller stops waiting then, through
    /// [`Inner::no_answer`]); learns from the answer. `body` is the call's
    /// ([`Inner::request_body`]): the attempt's deadline, trace context and the
    /// watermarks it names go out in a head of their own before it, not in a copy.
    /// `traceparent`: the W3C context of the attempt's span (empty: none); `sent`
    /// is set once the request starts out ([`Transport::call_noting`]).
    pub(crate) async fn ask(
        &self,
        c: &Candidate,
        body: &pb::ClientRequest,
        since: Instant,
        deadline_at: Instant,
        traceparent: String,
        sent: &transport::Sent,
    ) -> Result<(pb::client_response::Response, Served), Error> {
        // An answer's time is the path's and the replica's, what routing and
        // hedging learn from, except a write's that waited for other regions: the
        // WAN's, which would make its replica look far away.
        let waited = match &body.request {
            Some(pb::client_request::Request::Mutate(m)) => {
                m.wait_regions > 0 || m.wait_all_regions
            }
            // A batch's answer waits for its slowest row: not a round trip.
            Some(pb::client_request::Request::MutateRows(_)) => true,
            _ => false,
        };
        let write = matches!(
            &body.request,
            Some(
                pb::client_request::Request::Mutate(_) | pb::client_request::Request::MutateRows(_)
            )
        );
        let head = pb::ClientRequest {
            deadline_us: deadline_at.saturating_duration_since(since).as_micros() as u64,
            traceparent,
            known_watermarks: self.known_digest(&c.replica),
            ..Default::default()
        };
        let mut resp = match self
            .transport
            .call_noting(&c.replica, &head, body, sent)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                self.mark_down(&c.replica, DOWN_FOR);
                return Err(e);
            }
        };
        let at = Instant::now();
        let elapsed = at.saturating_duration_since(since);
        if !waited {
            // The round trip from when the request went out: a handshake before it
            // is not the replica's.
            let out = sent.at().unwrap_or(since).max(since);
            self.note_rtt(&c.replica, at.saturating_duration_since(out));
        }
        let served = resp.served_by.take().unwrap_or_default();
        if served.deployment != 0 && served.deployment != self.current_digest() {
            *self.announced.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((c.replica.clone(), served.deployment));
        }
        let wm = match &served.watermarks {
            Some(w) => {
                let wm = Arc::new(ScopeWatermarks::from_proto(w));
                self.learn_watermarks(&c.replica, &wm, served.watermarks_digest, self.wall_ms(at));
                Some(wm)
            }
            // Left out as the ones this request named: unchanged.
            None if served.watermarks_digest != 0 => {
                self.named_watermarks(&c.replica, served.watermarks_digest, self.wall_ms(at))
            }
            None => None,
        };
        let served = Served {
            region: served.region,
            watermarks: wm,
            at,
        };
        match resp.response {
            // The replica stopped waiting for a write it had taken (docs/protocol.md, §4).
            Some(pb::client_response::Response::Error(e))
                if write && e.code == pb::error::Code::DeadlineExceeded as i32 =>
            {
                Err(Error::Ambiguous {
                    replica: c.replica.to_string(),
                    detail: e.message,
                })
            }
            Some(pb::client_response::Response::Error(e)) => Err(Error::from_wire(&e, &c.replica)),
            Some(r) => {
                if !waited {
                    let now = self.us(at);
                    self.hedger().record(now, elapsed);
                }
                Ok((r, served))
            }
            None => Err(Error::Internal(format!(
                "replica {} sent an empty response",
                c.replica
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replica marked down is down until its time is up, then not; another is
    /// never taken for down with it; one cleared is up at once.
    #[test]
    fn a_replica_is_down_until_its_time_and_alone() {
        let clock = clock::Clock::new();
        let down = DownSet::default();
        let (a, b) = (ReplicaId::from("use1-a"), ReplicaId::from("use1-b"));
        let now = Instant::now();
        assert!(!down.is_down(&clock, &a, now), "nothing marked yet");
        down.mark(&clock, &a, now + Duration::from_secs(1));
        assert!(down.is_down(&clock, &a, now));
        assert!(!down.is_down(&clock, &b, now), "only the replica marked");
        assert!(!down.is_down(&clock, &a, now + Duration::from_secs(2)));
        // A shorter mark of another does not shorten the first's.
        down.mark(&clock, &b, now + Duration::from_millis(10));
        assert!(down.is_down(&clock, &a, now + Duration::from_millis(500)));
        assert!(!down.is_down(&clock, &b, now + Duration::from_millis(500)));
        down.clear(&a);
        assert!(!down.is_down(&clock, &a, now));
    }
}
