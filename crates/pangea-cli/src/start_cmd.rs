//! `pangea start`: run a replica.

use anyhow::Result;
use clap::Args;
use serde::Serialize;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Flags of `pangea start`; each may also come from the config file or `PANGEA_*`.
#[derive(Debug, Args, Serialize)]
pub(crate) struct StartArgs {
    /// A node config file (TOML); flags and PANGEA_* variables override it.
    #[arg(long)]
    #[serde(skip)]
    config: Option<PathBuf>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    topology: Option<PathBuf>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    placement: Option<PathBuf>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    replica: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<PathBuf>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    certs: Option<PathBuf>,
    /// QUIC listen address (default: the replica's address in the topology).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<SocketAddr>,
    /// Admin HTTP address for /metrics, /health, /watermarks.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    admin: Option<SocketAddr>,
    /// Delay replication traffic by the topology's latencies (local clusters).
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    emulate_wan: bool,
    /// fsync (default) or os-buffer.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    durability: Option<pangea_node::config::Durability>,
    /// Export traces over OTLP/HTTP to this collector (base URL, e.g.
    /// http://127.0.0.1:4318); also OTEL_EXPORTER_OTLP_ENDPOINT. Off by default.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    otlp_endpoint: Option<String>,
    /// How often to check the certificate files for changes, in ms (default
    /// 30000; 0: only on SIGHUP).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    certs_reload_interval_ms: Option<u64>,
    /// Fault injection (drills): skew this replica's wall clock by this many ms
    /// (negative: behind). Default 0.
    #[arg(long, allow_hyphen_values = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    clock_offset_ms: Option<i64>,
    /// Drills only: accept runtime faults (link partitions and loss, clock
    /// offsets) on the admin endpoint's /fault routes (`pangea cluster nemesis`).
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    fault_injection: bool,
    /// This replica is created with a new cluster: its empty store is the truth
    /// (recorded on the first start). Without it, a replica whose store never
    /// caught up waits to hear a peer of every scope before serving reads.
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    new_cluster: bool,
    /// Runtime threads: 0 (default) one per core; 1 a single-threaded runtime,
    /// best when replicas share a machine.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    threads: Option<usize>,
    /// Row cache memory in MiB (default 64; 0: off).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    row_cache_mib: Option<u64>,
    /// Memory for client request frames being received, per connection (MiB,
    /// default 64).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    frame_budget_connection_mib: Option<u64>,
    /// The same over all client connections (MiB, default 256).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    frame_budget_mib: Option<u64>,
    /// Handshakes in flight beyond which unvalidated addresses get a QUIC Retry
    /// (default 64).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_above: Option<usize>,
    /// Handshakes in flight, in total (default 512).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    handshakes_max: Option<usize>,
    /// Handshakes in flight per source address (default 128).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    handshakes_per_source_max: Option<usize>,
    /// Open connections, in total (default 8192).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    connections_max: Option<usize>,
    /// Open connections per source address (default 1024).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    connections_per_source_max: Option<usize>,
    /// Free space to keep on the data directory's file system, in MiB (default
    /// 256): below it, writes are refused until there is room again.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    disk_reserve_mib: Option<u64>,
}

pub(crate) fn start(args: StartArgs) -> Result<()> {
    // First, while this process has one thread: reading LISTEN_FDS clears it.
    let sockets = pangea_node::Sockets::inherited()?;
    let config = pangea_node::NodeConfig::load(args.config.as_deref(), &args)?;
    // Before the logging setup, which adds the trace exporter's layer.
    pangea_node::telemetry::configure(config.otlp_endpoint.as_deref(), &config.replica)?;
    crate::init_logging();
    if !config.huge_pages {
        // Before the runtime and the store allocate: no 2 MiB page zeroed on a
        // serving thread's fault (NodeConfig::huge_pages).
        crate::no_huge_pages();
    } else if let Err(e) = nix::sys::prctl::set_thp_disable(false) {
        // Asked for, where a parent (`pangea demo`) turned them off.
        tracing::warn!(error = %e, "cannot turn transparent huge pages back on");
    }
    let runtime = config.runtime().build()?;
    let result = runtime.block_on(async move {
        let shutdown = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
        };
        pangea_node::run_with_sockets(config, sockets, shutdown).await
    });
    // Export what is still queued.
    pangea_node::telemetry::shutdown();
    result
}
