//! The node's configuration: a file, then `PANGEA_*` environment variables, then
//! command-line flags (figment layering lives here, at the edge; library crates take
//! plain structs).

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything `pangea start` needs. Field names are the config-file keys and, upper-
/// cased with a `PANGEA_` prefix, the environment variables.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// The topology file.
    pub topology: PathBuf,
    /// The placement file; without one only the global policy exists.
    #[serde(default)]
    pub placement: Option<PathBuf>,
    /// This replica's id in the topology.
    pub replica: String,
    /// Where the store lives.
    pub data_dir: PathBuf,
    /// The cluster certificates directory (`pangea certs init`).
    pub certs: PathBuf,
    /// QUIC listen address; default: the replica's `address` in the topology.
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// Admin HTTP address (`/metrics`, `/health`, `/watermarks`); default: none.
    #[serde(default)]
    pub admin: Option<SocketAddr>,
    /// Delay outgoing replication datagrams by the topology's one-way latency to
    /// each peer (local clusters; no root or netem needed).
    #[serde(default)]
    pub emulate_wan: bool,
    /// Seed of the WAN emulator's jitter and loss.
    #[serde(default)]
    pub wan_seed: u64,
    /// `fsync` (default: acknowledged writes survive power loss) or `os-buffer`
    /// (they survive `kill -9` of the process only).
    #[serde(default)]
    pub durability: Durability,
    /// Send traces to this OTLP/HTTP collector, a base URL such as
    /// `http://127.0.0.1:4318` (off by default; `OTEL_EXPORTER_OTLP_ENDPOINT` also
    /// turns it on). See `telemetry` and docs/client.md#traces.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// Heartbeat interval of the replication core, in ms.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_interval_ms: u64,
    /// Most client requests served at once; beyond it, requests wait.
    #[serde(default = "default_requests_max")]
    pub client_requests_max: usize,
    /// How long a graceful shutdown waits for in-flight requests, in ms.
    #[serde(default = "default_drain_ms")]
    pub drain_ms: u64,
    /// How often the certificate files (`ca.pem`, `crl.pem`, this replica's
    /// certificate and key under `certs`) are checked for changes, in ms; a change
    /// is loaded for the next handshakes and connections whose peer certificate no
    /// longer verifies (revoked, CA dropped) are closed. Default 30 000, so a
    /// revocation takes effect within 30 s (the runbook promises 60 s); 0 turns
    /// polling off (SIGHUP still reloads).
    #[serde(default = "default_certs_reload_ms")]
    pub certs_reload_interval_ms: u64,
    /// Fault injection for drills: added to this replica's wall clock (ms, may be
    /// negative), as if its time source were that far off. 0 (the default) in
    /// production. A replica more than `max_offset` (500 ms) behind most of its
    /// peers fences itself and refuses writes (docs/invariants.md, I1).
    #[serde(default)]
    pub clock_offset_ms: i64,
    /// Drills only: accept the admin endpoint's `/fault` routes (partition or drop
    /// traffic toward peers, skew the clock at runtime; see `fault`). Off by
    /// default: a production replica answers them with 403.
    #[serde(default)]
    pub fault_injection: bool,
    /// This replica is created with a new cluster: an empty store is the truth,
    /// and reads may be served from it without hearing a peer first. Recorded in
    /// the data directory on the first start (`DATA_DIR/readiness`) and ignored
    /// once the store holds anything; `pangea cluster up` passes it for a fresh
    /// directory. A replica added to a running cluster must not have it: it waits
    /// to catch up with its peers (readiness.rs).
    #[serde(default)]
    pub new_cluster: bool,
    /// Threads of the runtime that serves clients and peers. 0 (the default): one
    /// per core, work-stealing, for a replica that has the machine to itself. 1: a
    /// single-threaded runtime, for replicas that share a machine (`pangea cluster
    /// up` starts its replicas so): no cross-thread wake-ups, and the answers that
    /// one pass over ready requests produces leave in one batch of datagrams.
    /// Storage writes and fsyncs run on their own thread either way.
    #[serde(default)]
    pub threads: usize,
    /// How long the serving runtime keeps polling its sockets after a client's
    /// request before it sleeps until the next one, in µs (default 0: it sleeps
    /// as soon as it has nothing to do). Under load the next request comes
    /// before the kernel would have woken a sleeping thread, so polling serves
    /// it sooner and leaves no core idle between requests; while no request
    /// comes, it costs nothing. For a replica with cores of its own, on the
    /// single-threaded runtime (`threads = 1`; ignored otherwise); at most
    /// 10,000. See `poll` and docs/operations.md.
    #[serde(default)]
    pub serve_poll_us: u64,
    /// Nice value of the driver's thread (writes, fsyncs, replication), 0–19
    /// (default 5): behind the serving threads, so reads do not wait for the CPU
    /// while writes are applied (`priority.rs`). 0 leaves it as started.
    #[serde(default = "default_driver_nice")]
    pub driver_nice: i32,
    /// Nice value of the store's flush and compaction threads, 0–19 (default 10):
    /// behind the driver and the serving threads. 0 leaves them as started.
    #[serde(default = "default_compaction_nice")]
    pub compaction_nice: i32,
    /// Memory for the row cache, in MiB (default 64): decoded hot rows and their
    /// encoded answers, so point reads of them skip the store and the encoding. A
    /// row counts twice its stored size; rows stored in more than 1/512 of it (128
    /// KiB of 64 MiB) are read from the store each time; 0 turns the cache off.
    #[serde(default = "default_row_cache_mib")]
    pub row_cache_mib: u64,
    /// Memory for client request frames still being received, per connection, in
    /// MiB (default 64: several maximal 16 MiB writes at once). A frame is counted
    /// at its announced size before it is read; one that does not fit is refused
    /// (its stream stopped, the client told why).
    #[serde(default = "default_frame_budget_connection_mib")]
    pub frame_budget_connection_mib: u64,
    /// The same budget over every client connection of the replica, in MiB
    /// (default 256).
    #[serde(default = "default_frame_budget_mib")]
    pub frame_budget_mib: u64,
    /// Handshakes in flight beyond which connection attempts from addresses not
    /// yet validated get a stateless QUIC Retry (default 64; `pangea_net::admission`).
    #[serde(default = "default_retry_above")]
    pub retry_above: usize,
    /// Handshakes in flight, in total (default 512) and per source address (128);
    /// attempts beyond are refused.
    #[serde(default = "default_handshakes_max")]
    pub handshakes_max: usize,
    #[serde(default = "default_handshakes_per_source_max")]
    pub handshakes_per_source_max: usize,
    /// Open connections, in total (default 8192) and per source address (1024).
    #[serde(default = "default_connections_max")]
    pub connections_max: usize,
    #[serde(default = "default_connections_per_source_max")]
    pub connections_per_source_max: usize,
    /// Free space the replica keeps on its data directory's file system, in MiB
    /// (default 256): below it, client writes are refused and replicated entries
    /// wait, so the store never meets a full disk (`disk`). 0: no reserve (a full
    /// disk then fails the store, which is reopened once space returns).
    #[serde(default = "default_disk_reserve_mib")]
    pub disk_reserve_mib: u64,
    /// Transparent huge pages for this process (default off, as Redis advises for
    /// latency): the kernel zeroes a whole 2 MiB page when a thread first touches
    /// it, and the allocator asks for them while replication grows the store's
    /// memory, so the serving thread stalls. Measured in docs/benchmarks.md
    /// ("Serving over replication"): off, read p99 during a bulk load replicating
    /// in was 5.7–5.8 ms against 7.5–10.4 ms on.
    #[serde(default)]
    pub huge_pages: bool,
}

impl NodeConfig {
    /// The connection admission limits these settings make.
    pub fn admission(&self) -> pangea_net::admission::AdmissionLimits {
        pangea_net::admission::AdmissionLimits {
            retry_above: self.retry_above,
            handshakes_max: self.handshakes_max,
            handshakes_per_source_max: self.handshakes_per_source_max,
            connections_max: self.connections_max,
            connections_per_source_max: self.connections_per_source_max,
        }
    }
}

/// A tokio runtime with `threads` threads: 0 one per core (work-stealing), 1 a
/// single-threaded runtime (the thread that calls `block_on` runs everything),
/// n > 1 n work-stealing workers (besides the `block_on` thread, which runs only
/// the future it is given); I/O and timers on.
pub fn runtime(threads: usize) -> tokio::runtime::Builder {
    let mut builder = match threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            if n > 1 {
                b.worker_threads(n);
            }
            b
        }
    };
    builder.enable_all();
    builder
}

/// When a write is acknowledged (`durability` in a node config, `--durability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Durability {
    /// Once fsynced (group commit): acknowledged writes survive power loss.
    #[default]
    Fsync,
    /// Once handed to the OS: they survive `kill -9` of the process only.
    OsBuffer,
}

impl Durability {
    /// As `--durability` and a node config file spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Fsync => "fsync",
            Durability::OsBuffer => "os-buffer",
        }
    }
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Durability, String> {
        match s {
            "fsync" => Ok(Durability::Fsync),
            "os-buffer" => Ok(Durability::OsBuffer),
            other => Err(format!("durability {other:?}: fsync or os-buffer")),
        }
    }
}

impl From<Durability> for pangea_store::Durability {
    fn from(d: Durability) -> Self {
        match d {
            Durability::Fsync => pangea_store::Durability::Fsync,
            Durability::OsBuffer => pangea_store::Durability::OsBuffer,
        }
    }
}

fn default_heartbeat_ms() -> u64 {
    50
}

fn default_requests_max() -> usize {
    4_096
}

fn default_drain_ms() -> u64 {
    5_000
}

fn default_certs_reload_ms() -> u64 {
    30_000
}

fn default_driver_nice() -> i32 {
    5
}

fn default_compaction_nice() -> i32 {
    10
}

fn default_row_cache_mib() -> u64 {
    64
}

fn default_frame_budget_connection_mib() -> u64 {
    64
}

fn default_frame_budget_mib() -> u64 {
    256
}

fn default_disk_reserve_mib() -> u64 {
    256
}

fn default_retry_above() -> usize {
    pangea_net::admission::AdmissionLimits::default().retry_above
}

fn default_handshakes_max() -> usize {
    pangea_net::admission::AdmissionLimits::default().handshakes_max
}

fn default_handshakes_per_source_max() -> usize {
    pangea_net::admission::AdmissionLimits::default().handshakes_per_source_max
}

fn default_connections_max() -> usize {
    pangea_net::admission::AdmissionLimits::default().connections_max
}

fn default_connections_per_source_max() -> usize {
    pangea_net::admission::AdmissionLimits::default().connections_per_source_max
}

impl NodeConfig {
    /// The tokio runtime [`NodeConfig::threads`] asks for (not started yet).
    pub fn runtime(&self) -> tokio::runtime::Builder {
        runtime(self.threads)
    }

    /// Layers an optional config file, `PANGEA_*` environment variables and the
    /// flags given (`overrides`, already serialized), later layers winning.
    pub fn load(
        file: Option<&std::path::Path>,
        overrides: &impl Serialize,
    ) -> anyhow::Result<NodeConfig> {
        use figment::providers::{Env, Format, Serialized, Toml};
        let mut f = figment::Figment::new();
        if let Some(file) = file {
            anyhow::ensure!(
                file.exists(),
                "node config file {} does not exist",
                file.display()
            );
            f = f.merge(Toml::file(file));
        }
        f = f.merge(
            Env::prefixed("PANGEA_")
                .ignore(&["topology_", "placement_"])
                .only(&FIELDS),
        );
        f = f.merge(Serialized::defaults(overrides));
        let config: NodeConfig = f
            .extract()
            .map_err(|e| anyhow::anyhow!("node configuration: {e}"))?;
        anyhow::ensure!(
            config.serve_poll_us <= crate::poll::WINDOW_MAX_US,
            "node configuration: serve_poll_us = {} is above its limit of {} µs",
            config.serve_poll_us,
            crate::poll::WINDOW_MAX_US
        );
        for (field, nice) in [
            ("driver_nice", config.driver_nice),
            ("compaction_nice", config.compaction_nice),
        ] {
            anyhow::ensure!(
                (0..=19).contains(&nice),
                "node configuration: {field} = {nice} is not a nice value from 0 to 19"
            );
        }
        Ok(config)
    }
}

/// Keys the environment may set (so unrelated `PANGEA_*` variables, such as the
/// topology overrides, are not mistaken for node settings).
const FIELDS: [&str; 32] = [
    "topology",
    "placement",
    "replica",
    "data_dir",
    "certs",
    "listen",
    "admin",
    "emulate_wan",
    "wan_seed",
    "durability",
    "otlp_endpoint",
    "heartbeat_interval_ms",
    "client_requests_max",
    "drain_ms",
    "certs_reload_interval_ms",
    "clock_offset_ms",
    "fault_injection",
    "new_cluster",
    "threads",
    "serve_poll_us",
    "driver_nice",
    "compaction_nice",
    "row_cache_mib",
    "frame_budget_connection_mib",
    "frame_budget_mib",
    "retry_above",
    "handshakes_max",
    "handshakes_per_source_max",
    "connections_max",
    "connections_per_source_max",
    "disk_reserve_mib",
    "huge_pages",
];

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::runtime::RuntimeFlavor;

    /// A node config file of the required keys and `extra`, loaded.
    fn try_load(extra: &str) -> anyhow::Result<NodeConfig> {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("node.toml");
        std::fs::write(
            &file,
            format!(
                "topology = \"t.toml\"\nreplica = \"r\"\ndata_dir = \"d\"\ncerts = \"c\"\n{extra}"
            ),
        )
        .expect("write config");
        NodeConfig::load(Some(&file), &serde_json::json!({}))
    }

    fn load(extra: &str) -> NodeConfig {
        try_load(extra).expect("config loads")
    }

    /// The error of a config that must not load.
    fn refused(extra: &str) -> String {
        match try_load(extra) {
            Ok(_) => panic!("{extra:?} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn threads_pick_the_runtime() {
        let flavor = |c: &NodeConfig| {
            c.runtime()
                .build()
                .expect("runtime")
                .handle()
                .runtime_flavor()
        };
        let default = load("");
        assert_eq!(default.threads, 0);
        assert_eq!(flavor(&default), RuntimeFlavor::MultiThread);
        assert_eq!(flavor(&load("threads = 1")), RuntimeFlavor::CurrentThread);
        assert_eq!(flavor(&load("threads = 3")), RuntimeFlavor::MultiThread);
    }

    #[test]
    fn durability_is_one_of_two_words() {
        assert_eq!(load("").durability, Durability::Fsync);
        assert_eq!(
            load("durability = \"os-buffer\"").durability,
            Durability::OsBuffer
        );
        let e = refused("durability = \"fsyncc\"");
        assert!(
            e.contains("fsyncc") && e.contains("os-buffer") && e.contains("durability"),
            "{e}"
        );
    }

    #[test]
    fn huge_pages_are_off_unless_asked_for() {
        assert!(!load("").huge_pages);
        assert!(load("huge_pages = true").huge_pages);
    }

    #[test]
    fn background_threads_are_niced_unless_told_otherwise() {
        let c = load("");
        assert_eq!((c.driver_nice, c.compaction_nice), (5, 10));
        let c = load("driver_nice = 0\ncompaction_nice = 19");
        assert_eq!((c.driver_nice, c.compaction_nice), (0, 19));
        let e = refused("compaction_nice = 25");
        assert!(
            e.contains("compaction_nice = 25") && e.contains("0 to 19"),
            "{e}"
        );
    }

    #[test]
    fn serve_polling_is_off_unless_asked_for_and_bounded() {
        assert_eq!(load("").serve_poll_us, 0);
        assert_eq!(load("serve_poll_us = 500").serve_poll_us, 500);
        let e = refused("serve_poll_us = 20000");
        assert!(
            e.contains("serve_poll_us = 20000") && e.contains("10000"),
            "{e}"
        );
    }

    #[test]
    fn row_cache_size_defaults_to_64_mib() {
        assert_eq!(load("").row_cache_mib, 64);
        assert_eq!(load("row_cache_mib = 0").row_cache_mib, 0);
    }
}
