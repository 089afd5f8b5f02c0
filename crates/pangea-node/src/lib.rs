//! `pangea-node`: the replica process — the sans-IO replication core driven over
//! QUIC with mutual TLS, on the fjall store, with an admin endpoint.
//!
//! The shape follows mini-redis: [`run`] takes a configuration and a shutdown
//! future; the `pangea start` binary only parses flags. Inside:
//!
//! - [`driver`]: one task owns the core; every turn ends with one fsync (group
//!   commit) before writes are acknowledged and frames leave; it also steps the
//!   placement migration jobs this replica runs (`pangea_core::migration`) and
//!   the readiness gate (`pangea_core::readiness`; [`readiness`] keeps its record
//!   on disk and its phase log);
//! - [`migration`]: an operator's move handed to the driver;
//! - [`peers`]: a task per peer sends its frames over a long-lived connection
//!   (reconnecting with backoff); incoming peer streams are checked (hello against
//!   certificate) and read into the driver;
//! - [`serve`]: client requests, one QUIC stream each, reads answered from the store
//!   after the consistency check, writes through the driver;
//! - [`admin`] and [`metrics`]: `/metrics`, `/health`, `/watermarks`;
//! - [`shared`]: what the driver, peer tasks and request handlers share, by
//!   concern: the deployment and its files, what the driver publishes each turn,
//!   the intake's caps and counts;
//! - [`config`]: file, `PANGEA_*` environment and flags, layered by figment;
//! - [`clock`]: monotonic and (offsettable) wall time;
//! - [`telemetry`]: W3C trace context from client requests, OTLP trace export.

pub mod admin;
pub mod audit_log;
pub mod clock;
pub mod config;
pub mod disk;
pub mod driver;
pub mod fault;
pub mod lag;
pub mod metrics;
pub mod migration;
pub mod peers;
pub mod poll;
mod priority;
pub mod readiness;
pub mod reload;
pub mod serve;
pub mod shared;
pub mod telemetry;

use anyhow::{Context, Result};
use pangea_core::auth::Principal;
use pangea_core::replica::{Config as CoreConfig, Replica};
use pangea_net::PeerIdentity;
use pangea_store::{Store, StoreOptions};
use pangea_topology::{Deployment, ReplicaId};
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

pub use config::NodeConfig;
pub use shared::{Inflight, InflightGuard, Shared, Sources};

/// Inputs waiting for the driver; readers of peer streams wait when it is full,
/// which pushes back through QUIC flow control to the senders.
pub const DRIVER_QUEUE_MAX: usize = 8_192;

impl admin::AdminState for Shared {
    fn metrics_text(&self) -> String {
        self.refresh_gauges();
        self.metrics.encode()
    }

    fn health(&self) -> admin::Health {
        let phase = self.phase();
        let fence = self.published.clock_fence();
        let storage = self.disk.state();
        let ok = self.published.healthy()
            && !self.driver.is_closed()
            && phase == readiness::Phase::Ready
            && fence.is_none()
            && storage == disk::StorageState::Ok;
        let suspected: Vec<String> = self
            .published
            .suspected()
            .iter()
            .map(|r| r.to_string())
            .collect();
        admin::Health {
            ok,
            replica: self.id.to_string(),
            region: self.region.to_string(),
            detail: serde_json::json!({
                "phase": phase.to_string(),
                "storage": storage.to_string(),
                "suspected_peers": suspected,
                "requests_in_flight": self.intake.inflight.count(),
                "clock_fence": fence,
            }),
        }
    }

    fn fault(&self, action: &str, query: &str) -> Result<serde_json::Value, fault::FaultError> {
        self.faults
            .as_ref()
            .ok_or(fault::FaultError::Disabled)?
            .handle(action, query)
    }

    fn watermarks(&self) -> admin::Watermarks {
        let now_ms = self.clock.now().wall_ms;
        let all = self.published.watermarks();
        let scopes = all
            .values()
            .map(|wm| admin::ScopeMarks {
                scope: wm.scope.to_string(),
                low_watermark: wm.low_watermark().as_u64(),
                low_watermark_age_ms: now_ms.saturating_sub(wm.low_watermark().wall_ms()),
                origins: wm
                    .iter()
                    .map(|(o, w)| {
                        let mark = admin::OriginMark {
                            sequence: w.sequence,
                            timestamp: w.timestamp.as_u64(),
                            lag_ms: now_ms.saturating_sub(w.timestamp.wall_ms()),
                        };
                        (o.to_string(), mark)
                    })
                    .collect(),
            })
            .collect();
        admin::Watermarks {
            replica: self.id.to_string(),
            region: self.region.to_string(),
            scopes,
            apply_lag: self.apply_lag.summary(),
        }
    }
}

/// Every peer this replica talks to: the members of every scope it belongs to that
/// have an address (a malformed address is skipped with a warning: validation of the
/// topology file is where it is refused).
pub fn peer_addresses(d: &Deployment, id: &ReplicaId) -> BTreeMap<ReplicaId, SocketAddr> {
    let mut peers = BTreeMap::new();
    // Every scope, not only every policy: a process of a many-process replica
    // has the peers of the groups it hosts.
    for scope in d.scopes().filter(|s| d.allowed(id, s)) {
        for m in d.scope_members(scope) {
            let Some(a) = d
                .topology
                .replica(m.as_str())
                .and_then(|r| r.address.as_deref())
            else {
                continue;
            };
            if m == *id {
                continue;
            }
            match parse_addr("topology address", a) {
                Ok(addr) => {
                    peers.insert(m.clone(), addr);
                }
                Err(e) => tracing::warn!(replica = %m, error = %e, "peer has an unusable address"),
            }
        }
    }
    peers
}

fn parse_addr(what: &str, s: &str) -> Result<SocketAddr> {
    s.parse()
        .with_context(|| format!("{what}: {s:?} is not host:port"))
}

/// Sockets bound before the replica starts, by a parent process (`pangea cluster up`
/// hands them down; see `pangea start`) or by an embedding test. Each must be bound to
/// the address the replica would bind itself (its topology address or `listen`; its
/// `admin`), which `run_with_sockets` checks: a port picked by the parent is never
/// free for another process to take between the pick and the bind.
#[derive(Debug, Default)]
pub struct Sockets {
    /// The QUIC (UDP) socket.
    pub quic: Option<std::net::UdpSocket>,
    /// The admin endpoint's listening TCP socket.
    pub admin: Option<std::net::TcpListener>,
}

impl Sockets {
    /// Sockets handed down by the parent process in systemd's socket-activation
    /// protocol (`LISTEN_FDS`, descriptors from 3): the first the QUIC UDP socket,
    /// the second, if any, the admin TCP listener. `pangea cluster up` starts
    /// replicas so; a systemd `.socket` unit with a `ListenDatagram=` and a
    /// `ListenStream=` line can too. Without `LISTEN_FDS`, none: the replica binds
    /// its own. Call it while the process has one thread (it clears the variables).
    pub fn inherited() -> Result<Sockets> {
        let mut fds = listenfd::ListenFd::from_env();
        let mut sockets = Sockets::default();
        if fds.len() == 0 {
            return Ok(sockets);
        }
        anyhow::ensure!(
            fds.len() <= 2,
            "LISTEN_FDS={}: expected the QUIC socket and at most the admin listener",
            fds.len()
        );
        sockets.quic = fds
            .take_udp_socket(0)
            .map_err(|e| anyhow::anyhow!("LISTEN_FDS: descriptor 3 (the QUIC socket): {e}"))?;
        if fds.len() == 2 {
            sockets.admin = fds.take_tcp_listener(1).map_err(|e| {
                anyhow::anyhow!("LISTEN_FDS: descriptor 4 (the admin listener): {e}")
            })?;
        }
        Ok(sockets)
    }
}

/// Runs a replica until `shutdown` resolves, then stops accepting, drains in-flight
/// requests (up to `drain_ms`), fsyncs and closes.
pub async fn run(config: NodeConfig, shutdown: impl Future<Output = ()>) -> Result<()> {
    run_with_sockets(config, Sockets::default(), shutdown).await
}

/// [`run`] on sockets bound beforehand (see [`Sockets`]); those not given are bound
/// here as `run` binds them.
pub async fn run_with_sockets(
    config: NodeConfig,
    sockets: Sockets,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let deployment = Arc::new(
        Deployment::load(&config.topology, config.placement.as_deref())
            .map_err(|p| anyhow::anyhow!("{p}"))?,
    );
    let sources = Sources::read(&config).context("reading the deployment's files")?;
    let id = ReplicaId::from(config.replica.as_str());
    let me = deployment
        .topology
        .replica(&config.replica)
        .with_context(|| {
            format!(
                "replica {:?} is not in topology {}",
                config.replica,
                config.topology.display()
            )
        })?
        .clone();
    let listen = match (config.listen, &me.address) {
        (Some(a), _) => a,
        (None, Some(a)) => parse_addr("topology address", a)?,
        (None, None) => anyhow::bail!("replica {id} has no address in the topology; pass --listen"),
    };
    let store = Store::open(&config.data_dir, store_options(&config))?;
    priority::lower_store_workers(config.compaction_nice);

    // Whether this replica trusts its store (readiness.rs): a replica created with
    // a new cluster records it on its first start, while its store is empty.
    if config.new_cluster && readiness::Record::read(&config.data_dir).is_none() {
        use pangea_core::Storage as _;
        if store.watermarks()?.is_empty() {
            readiness::Record::NewCluster.write(&config.data_dir)?;
            tracing::info!("a replica of a new cluster: its empty store is the truth");
        } else {
            tracing::warn!(
                "--new-cluster ignored: the store already holds data it never recorded \
                 catching up with; it waits to hear its peers"
            );
        }
    }

    // Kept across restarts, so a restarted replica resets the connections its
    // predecessor left behind instead of leaving them to time out (pangea_net::reset).
    let reset_key = pangea_net::ResetKey::load_or_create(&config.data_dir.join("quic-reset.key"))?;

    // Certificates, trust bundle and CRL are reloaded while running (reload.rs).
    let tls = pangea_net::LiveTls::load(pangea_net::TlsFiles::replica(
        &config.certs,
        id.as_str(),
        me.region.as_str(),
    )?)?;
    let server = tls.server_config()?;
    let client = tls.client_config()?;
    let peers = peer_addresses(&deployment, &id);
    // The WAN emulator delays traffic by the topology's latencies; fault injection
    // needs it too (to cut or thin links), with no delay unless asked.
    let links = (config.emulate_wan || config.fault_injection).then(|| {
        let links = fault::Links::new(pangea_net::wan::WanControl::new(), config.emulate_wan);
        links.learn(&deployment, &id);
        Arc::new(links)
    });
    let wan = links
        .as_ref()
        .map(|l| pangea_net::wan::WanEmulator::new(l.control().clone(), config.wan_seed));
    let endpoint = match sockets.quic {
        Some(socket) => {
            let bound = socket.local_addr()?;
            anyhow::ensure!(
                bound == listen,
                "the QUIC socket handed to replica {id} is bound to {bound}, but it listens \
                 on {listen} (its topology address or --listen)"
            );
            pangea_net::endpoint_on_socket(socket, Some(server), client, wan, Some(&reset_key))?
        }
        None => pangea_net::bind_endpoint(listen, Some(server), client, wan, Some(&reset_key))?,
    };

    let clock = Arc::new(clock::Clock::default());
    if config.clock_offset_ms != 0 {
        tracing::warn!(
            offset_ms = config.clock_offset_ms,
            "fault injection: this replica's wall clock is skewed (clock_offset_ms)"
        );
        clock.set_offset_ms(config.clock_offset_ms);
    }
    let disk = Arc::new(disk::Disk::new(
        config.disk_reserve_mib.saturating_mul(1 << 20),
    ));
    let faults = match &links {
        Some(links) if config.fault_injection => {
            tracing::warn!("fault injection is on: /fault on the admin endpoint can cut links");
            Some(fault::FaultControl::new(
                links.clone(),
                clock.clone(),
                disk.clone(),
            ))
        }
        _ => None,
    };
    let core_config = CoreConfig {
        heartbeat_interval_ms: config.heartbeat_interval_ms,
        ..CoreConfig::default()
    };
    let core_limits = core_config.limits;
    let seed = u64::from(listen.port()) ^ 0x7061_6e67_6561;
    let replica = Replica::new(
        id.clone(),
        deployment.clone(),
        core_config,
        store.clone(),
        seed,
        clock.now(),
    )?;
    let (writes_tx, tx, inbox) = driver::Inbox::new(DRIVER_QUEUE_MAX);
    let shared = Arc::new(Shared::new(shared::Parts {
        id: id.clone(),
        region: me.region.clone(),
        seed,
        config: config.clone(),
        core_limits,
        clock,
        deployment: deployment.clone(),
        sources,
        location: replica.location().clone(),
        store,
        disk,
        driver: tx,
        driver_writes: writes_tx,
        endpoint: endpoint.clone(),
        tls,
        faults,
        links,
        audit: audit_log::AuditLog::open(&config.data_dir, id.as_str())?,
    }));
    let mut queues = driver::PeerQueues::new();
    for (peer, addr) in peers {
        queues.insert(peer.clone(), peers::spawn(&shared, peer, addr));
    }
    // The driver gets its own thread and runtime: storage calls (fsync above all)
    // block, and must never stall the tasks that serve clients (principle 6).
    let driver_shared = shared.clone();
    let driver_nice = shared.config.driver_nice;
    let driver = std::thread::Builder::new()
        .name(format!("pangea-driver-{id}"))
        .spawn(move || {
            priority::lower_this_thread(driver_nice, "driver");
            match tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
            {
                Ok(rt) => rt.block_on(driver::run(replica, inbox, driver_shared, queues)),
                Err(e) => tracing::error!(error = %e, "cannot start the driver runtime"),
            }
        })?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let admin = match (sockets.admin, config.admin) {
        (Some(listener), wanted) => {
            let bound = listener.local_addr()?;
            anyhow::ensure!(
                wanted.is_none_or(|w| w == bound),
                "the admin socket handed to replica {id} is bound to {bound}, but --admin \
                 says {}",
                wanted.map(|w| w.to_string()).unwrap_or_default()
            );
            listener.set_nonblocking(true)?;
            Some(tokio::net::TcpListener::from_std(listener)?)
        }
        (None, Some(admin_addr)) => Some(
            tokio::net::TcpListener::bind(admin_addr)
                .await
                .with_context(|| format!("admin address {admin_addr}"))?,
        ),
        (None, None) => None,
    };
    let admin_addr = admin.as_ref().and_then(|l| l.local_addr().ok());
    if let Some(listener) = admin {
        let state: Arc<dyn admin::AdminState> = shared.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            if let Err(e) = admin::serve(listener, state, stopped).await {
                tracing::error!(error = %e, "admin endpoint failed");
            }
        });
    }
    if shared.poller.enabled() {
        let poller = shared.poller.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = poller.run() => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        });
    }
    tracing::info!(replica = %id, region = %me.region, %listen, admin = ?admin_addr, "replica serving");
    watch_disk(&shared);
    reload::on_sighup(shared.clone());
    reload::poll_certificates(&shared);

    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            incoming = endpoint.accept() => {
                let Some(incoming) = incoming else { break };
                admit(&shared, incoming);
            }
            _ = &mut shutdown => break,
        }
    }

    // Graceful stop: refuse new connections, drain requests, fsync, close.
    tracing::info!(replica = %id, "shutting down");
    endpoint.set_server_config(None);
    let drain_until = tokio::time::Instant::now() + Duration::from_millis(config.drain_ms);
    while shared.intake.inflight.count() > 0 && tokio::time::Instant::now() < drain_until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    if shared
        .driver
        .send(driver::Input::Shutdown { done: done_tx })
        .await
        .is_ok()
    {
        let _ = done_rx.await;
    }
    let _ = tokio::task::spawn_blocking(move || driver.join()).await;
    let _ = stop_tx.send(true);
    endpoint.close(peers::CLOSE_SHUTDOWN.into(), b"replica shutting down");
    let _ = tokio::time::timeout(Duration::from_secs(2), endpoint.wait_idle()).await;
    tracing::info!(replica = %id, "stopped");
    Ok(())
}

/// How often refused and retried connection attempts are summed up in the log.
pub const ATTEMPTS_LOG_EVERY: Duration = Duration::from_secs(10);

/// Decides on a connection attempt (`pangea_net::admission`): a Retry, a refusal,
/// or a handshake in a task of its own.
fn admit(shared: &Arc<Shared>, incoming: quinn::Incoming) {
    use pangea_net::admission::Verdict;
    let source = incoming.remote_address().ip();
    let verdict = shared.intake.admission.admit(
        source,
        incoming.remote_address_validated(),
        incoming.may_retry(),
    );
    let outcome = match verdict {
        Verdict::Accept(guard) => {
            shared.metrics.inc_connection_attempts("accepted");
            let shared = shared.clone();
            tokio::spawn(async move { handle_incoming(shared, incoming, guard).await });
            return;
        }
        Verdict::Retry => {
            // Fails only if the attempt already carried a token: then refuse.
            if incoming.retry().is_err() {
                "refused_retry"
            } else {
                "retried"
            }
        }
        Verdict::Refuse(cap) => {
            incoming.refuse();
            match cap {
                "handshakes" => "refused_handshakes",
                "handshakes_per_source" => "refused_handshakes_per_source",
                "connections" => "refused_connections",
                _ => "refused_connections_per_source",
            }
        }
    };
    shared.metrics.inc_connection_attempts(outcome);
    let mut unlogged = shared
        .intake
        .attempts_unlogged
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let first = unlogged.is_empty();
    *unlogged.entry(outcome).or_default() += 1;
    drop(unlogged);
    if first {
        // The first of a burst: sum it up once the interval is over.
        let shared = shared.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ATTEMPTS_LOG_EVERY).await;
            let counts = std::mem::take(
                &mut *shared
                    .intake
                    .attempts_unlogged
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()),
            );
            let (handshakes, connections) = shared.intake.admission.in_flight();
            tracing::warn!(
                ?counts,
                handshakes,
                connections,
                "connection attempts retried or refused in the last {ATTEMPTS_LOG_EVERY:?} \
                 (a flood, or limits too low: docs/operations.md, connection limits)"
            );
        });
    }
}

/// Refused handshakes are logged at most once a second: a flood of them is
/// counted (`pangea_handshakes_refused_total`), not written out line by line.
static HANDSHAKE_LOG: OncePerSecond = OncePerSecond(std::sync::atomic::AtomicU64::new(0));

/// Says yes at most once per wall-clock second.
struct OncePerSecond(std::sync::atomic::AtomicU64);

impl OncePerSecond {
    fn allows(&self) -> bool {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.0.swap(now, Ordering::Relaxed) != now
    }
}

async fn handle_incoming(
    shared: Arc<Shared>,
    incoming: quinn::Incoming,
    handshake: pangea_net::admission::HandshakeGuard,
) {
    let remote = incoming.remote_address();
    // A peer replica's connection gets the windows of its link (the
    // bandwidth-delay product, `peers::link_windows`); clients get the defaults.
    // Who it is is checked after the handshake, as for every connection.
    let d = shared.deployment();
    let windows = peers::replica_at(&d, remote)
        .map(|peer| peers::link_windows(&d, &shared.id, &peer))
        .filter(|w| *w != pangea_net::tls::Windows::DEFAULT);
    let config = windows.and_then(|w| match shared.tls.server_config() {
        Ok(mut c) => {
            c.transport_config(Arc::new(pangea_net::tls::transport_config_with(w)));
            Some(Arc::new(c))
        }
        Err(e) => {
            tracing::warn!(error = %e, %remote, "cannot size a peer link's windows; using the defaults");
            None
        }
    });
    let handshaking = tokio::time::timeout(pangea_net::admission::HANDSHAKE_TIME_MAX, async {
        match config {
            Some(c) => incoming.accept_with(c)?.await,
            None => incoming.await,
        }
    });
    let connection = match handshaking.await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            // No client certificate, a foreign CA, expired, revoked, wrong ALPN...
            let reason = pangea_net::handshake::Refusal::of(&e).map(|(r, _)| r);
            shared
                .metrics
                .inc_handshakes_refused(reason.map_or("other", |r| r.reason()));
            shared.metrics.inc_frames_rejected("handshake");
            shared.metrics.inc_connection_attempts("handshake_failed");
            if HANDSHAKE_LOG.allows() {
                let why = reason.map_or_else(|| e.to_string(), |r| r.to_string());
                tracing::info!(%remote, %why, error = %e, "handshake refused (logged at most once a second)");
            }
            return;
        }
        Err(_) => {
            shared.metrics.inc_connection_attempts("handshake_timeout");
            return;
        }
    };
    // Held while the connection is served.
    let _slot = handshake.connected();
    // Re-verified on every certificate reload until the handler returns.
    let side = pangea_net::reload::Side::Accepted;
    let _tracked = match shared.tls.track(&connection, side) {
        Ok(t) => t,
        Err(e) => {
            let remote = connection.remote_address();
            tracing::warn!(error = %e, %remote, "connection refused after its handshake");
            shared.metrics.inc_frames_rejected("certificate_rejected");
            connection.close(
                pangea_net::reload::CLOSE_CERTIFICATE_UNTRUSTED.into(),
                b"certificate rejected",
            );
            return;
        }
    };
    match pangea_net::peer_identity(&connection) {
        Ok(PeerIdentity::Replica { id, region }) => {
            shared
                .intake
                .peer_connections
                .fetch_add(1, Ordering::Relaxed);
            peers::handle_peer(shared.clone(), connection, id, region).await;
            shared
                .intake
                .peer_connections
                .fetch_sub(1, Ordering::Relaxed);
        }
        Ok(PeerIdentity::Client { name, app_profile }) => {
            serve_caller(shared, connection, Principal::Client { name, app_profile }).await;
        }
        Ok(PeerIdentity::Loader { name, app_profile }) => {
            serve_caller(shared, connection, Principal::Loader { name, app_profile }).await;
        }
        Ok(PeerIdentity::Operator { name }) => {
            serve_caller(shared, connection, Principal::Operator { name }).await;
        }
        Err(e) => {
            tracing::debug!(error = %e, "no usable identity in the certificate");
            shared.metrics.inc_handshakes_refused("no_identity");
            shared.metrics.inc_frames_rejected("identity");
            connection.close(peers::CLOSE_UNKNOWN_REPLICA.into(), b"no pangea identity");
        }
    }
}

/// Serves the requests of a client, loader or operator connection (authorized per
/// request in `serve`).
async fn serve_caller(shared: Arc<Shared>, connection: quinn::Connection, caller: Principal) {
    shared
        .intake
        .client_connections
        .fetch_add(1, Ordering::Relaxed);
    serve::handle_client(shared.clone(), connection, caller).await;
    shared
        .intake
        .client_connections
        .fetch_sub(1, Ordering::Relaxed);
}

/// MiB as bytes, saturating.
pub(crate) fn mib(n: u64) -> usize {
    usize::try_from(n.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
}

/// How the store is opened, at start and when reopened (`disk`).
pub(crate) fn store_options(config: &NodeConfig) -> StoreOptions {
    StoreOptions {
        durability: config.durability.into(),
        row_cache_bytes: config.row_cache_mib.saturating_mul(1 << 20),
        ..Default::default()
    }
}

/// Reads the data directory's free space every second ([`disk`]): below the
/// reserve, writes are refused until there is room again.
fn watch_disk(shared: &Arc<Shared>) {
    let shared = shared.clone();
    tokio::spawn(async move {
        loop {
            match disk::free_bytes(&shared.config.data_dir) {
                Ok(free) => match shared.disk.observe(free) {
                    Some(disk::StorageState::Ok) => {
                        tracing::info!(
                            free_mib = free >> 20,
                            "disk has room again: accepting writes"
                        )
                    }
                    Some(full) => tracing::error!(%full, "refusing writes"),
                    None => {}
                },
                Err(e) => tracing::warn!(error = %e, "cannot read the data directory's free space"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
}
