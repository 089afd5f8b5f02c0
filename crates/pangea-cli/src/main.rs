//! `pangea`: the operator's command. This file parses flags, sets the allocator and
//! the logging, and hands each command to the module of its group:
//! - `demo_cmd`: `pangea demo`, the main job (`pangea_ops::demo`);
//! - `bench_cmd`: `pangea bench`, `bench-echo` and `bench-redis`, the harnesses of
//!   `pangea_ops::bench`;
//! - `start_cmd`: `pangea start`, one replica;
//! - `certs_cmd`: `pangea certs`, the cluster's CA and certificates;
//! - `cluster_cmd`: `pangea cluster`: every replica of a topology as a local process
//!   (up, down, stop, start, restart, status), over `pangea_ops::local`;
//! - `nemesis_cmd`: `pangea cluster nemesis` and `check-history`: the flags and
//!   report of `pangea_ops::nemesis` (fault injection into a running local cluster,
//!   a recorded history, the checkers run on it);
//! - `data_cmd`: `pangea get | put | incr | delete | scan | watermarks`;
//! - `load_cmd`: `pangea load`, bulk loading of batch-built rows (docs/bulk-load.md);
//! - `placement_cmd`: `pangea placement move | status | audit`;
//! - `store_cmd`: `pangea store inspect | get`, offline reads of a data directory;
//! - `topology_cmd`: `pangea topology check | plan | diff | apply | rollback` (apply
//!   and rollback through `pangea_ops::apply`);
//! - `sim_cmd`: `pangea sim run | check | swarm` (docs/drills.md);
//! - `calibrate_cmd`: `pangea sim calibrate`, the flags of `pangea_ops::calibrate`;
//! - `output`: how values and keys are shown to humans.

use clap::{Parser, Subcommand};

// The allocator is mimalloc, linked with its `override` feature so that it *is* the
// process's `malloc` (every C library's too), and Rust allocates through `System`,
// which calls `malloc` directly for the alignments Rust data needs. Through
// `mimalloc::MiMalloc`, every allocation took mimalloc's aligned entry point, whose
// fast path covers blocks of at most 1 KiB: larger ones (row values, frames, log
// batches) went through its generic aligned path and were padded by their alignment
// (docs/drills.md, "Where the time goes": 2 % fewer instructions, about 4 % less
// wall time on the simulator's reference run). On a platform where a static library
// cannot replace `malloc` (Windows), `System` is the platform's allocator.
use mimalloc as _;

#[global_allocator]
static ALLOCATOR: std::alloc::System = std::alloc::System;

/// The `pangea` binary the replicas of a local cluster run: this one.
pub(crate) fn pangea_binary() -> anyhow::Result<std::path::PathBuf> {
    use anyhow::Context as _;
    std::env::current_exe().context("cannot find the pangea binary")
}

/// A duration flag: `500ms`, `10s`, `5m`.
pub(crate) fn parse_duration(s: &str) -> anyhow::Result<std::time::Duration> {
    use anyhow::Context as _;
    pangea_topology::placement::parse_duration_ms(s)
        .map(std::time::Duration::from_millis)
        .with_context(|| format!("duration {s:?}: like 500ms, 10s, 5m"))
}

mod backup_cmd;
mod bench_cmd;
mod calibrate_cmd;
mod certs_cmd;
mod changes_cmd;
mod cluster_cmd;
mod data_cmd;
mod demo_cmd;
mod filter_args;
mod load_cmd;
mod nemesis_cmd;
mod output;
mod placement_cmd;
mod sim_cmd;
mod start_cmd;
mod store_cmd;
mod topology_cmd;

#[derive(Debug, Parser)]
#[command(
    name = "pangea",
    version,
    about = "Pangea: a multi-region replicated key-value serving layer"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The main job: a local multi-region cluster with emulated WAN, sample ad
    /// profiles, clients in every region and mode, and what they see.
    Demo(demo_cmd::DemoArgs),
    /// Load a cluster from one region and report HDR latencies.
    Bench(bench_cmd::LoadArgs),
    /// The floor: the same request/response sizes over a bare quinn echo server.
    BenchEcho(bench_cmd::EchoArgs),
    /// The baseline: Redis GET measured by this same harness (docs/benchmarks.md).
    BenchRedis(bench_cmd::RedisArgs),
    /// The ceilings: AEAD seals, memcpy and loopback UDP datagrams one core can
    /// do on this machine, which serving figures are fractions of.
    BenchCeilings(bench_cmd::CeilingsArgs),
    /// Run one replica.
    Start(start_cmd::StartArgs),
    /// Cluster certificates: a CA, replica and client leaf certificates.
    #[command(subcommand)]
    Certs(certs_cmd::CertsCommand),
    /// Local clusters: every replica of a topology as a process on 127.0.0.1.
    #[command(subcommand)]
    Cluster(cluster_cmd::ClusterCommand),
    /// Read one row.
    Get(data_cmd::GetArgs),
    /// Write cells of one row (FAMILY:COLUMN=VALUE ...); prints the write's token.
    Put(data_cmd::PutArgs),
    /// Add to counters of one row (FAMILY:COLUMN[=DELTA] ..., counter families);
    /// prints the write's token.
    Incr(data_cmd::IncrArgs),
    /// Delete a row or one family of it.
    Delete(data_cmd::DeleteArgs),
    /// Rows whose key starts with a prefix (and falls in a key range), forward or
    /// reverse, with server-side filters.
    Scan(data_cmd::ScanArgs),
    /// A table's change stream: every committed write (of rows under --prefix),
    /// each origin's in order, with the cursor to resume from.
    Changes(changes_cmd::ChangesArgs),
    /// Backups of a running cluster and point-in-time restores: create
    /// (full or incremental), restore, verify, show.
    #[command(subcommand)]
    Backup(backup_cmd::BackupCommand),
    /// Bulk-load batch-built rows into a table from NDJSON or length-delimited
    /// protobuf, each row written once at the nearest replica its placement allows and
    /// replicated along the trees; progress on stderr, a throughput and latency report
    /// (docs/bulk-load.md).
    Load(load_cmd::LoadArgs),
    /// Watermarks of every replica (or one).
    Watermarks(data_cmd::WatermarksArgs),
    /// Placement on a running cluster: move rows between policies, job status, audit.
    #[command(subcommand)]
    Placement(placement_cmd::PlacementCommand),
    /// Offline tools for a replica's data directory (the replica must be stopped).
    #[command(subcommand)]
    Store(store_cmd::StoreCommand),
    /// Check, plan and compare topology and placement files.
    #[command(subcommand)]
    Topology(topology_cmd::TopologyCommand),
    /// Failover drills and swarm testing in virtual time, on the replication code
    /// the replicas run (docs/drills.md).
    #[command(subcommand)]
    Sim(sim_cmd::SimCommand),
}

/// Output piped into `head` and the like: a closed pipe ends the command quietly,
/// as it would for any Unix tool, instead of a panic from `println!`.
fn quiet_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .unwrap_or("");
        if msg.contains("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141); // 128 + SIGPIPE, what a shell reports
        }
        default(info);
    }));
}

/// Logs to stderr; `PANGEA_LOG` (or `RUST_LOG`) sets the filter, default `info`.
/// Spans also go to OpenTelemetry when `pangea start` configured an OTLP endpoint
/// (`pangea_node::telemetry`; docs/client.md#traces).
///
/// Request spans (`pangea.*`) go to traces only, not to the log: the log layer
/// formats the fields of every span it sees when the span opens, which for a
/// replica serving small reads was a tenth of its CPU, to print them only around
/// the rare event logged inside a request (such events are still logged).
pub(crate) fn init_logging() {
    use tracing_subscriber::filter::{EnvFilter, FilterExt as _, filter_fn};
    use tracing_subscriber::layer::{Layer as _, SubscriberExt as _};
    use tracing_subscriber::util::SubscriberInitExt as _;
    let directives = std::env::var("PANGEA_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info,quinn=warn,fjall=warn,lsm_tree=warn".to_owned());
    let not_a_request_span = filter_fn(|m| !(m.is_span() && m.name().starts_with("pangea.")));
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Log files written by `pangea cluster up` must not carry colour codes.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(EnvFilter::new(&directives).and(not_a_request_span));
    let registry = tracing_subscriber::registry().with(log);
    // The trace layer only when exporting: a layer that wants request spans (even
    // one that is `None`, which counts as wanting everything) makes every request,
    // and every QUIC packet, build spans nobody reads: a tenth of a replica's CPU
    // on 1 KiB gets (docs/benchmarks.md).
    let _ = match pangea_node::telemetry::layer() {
        Some(traces) => registry
            .with(traces.with_filter(EnvFilter::new(&directives)))
            .try_init(),
        None => registry.try_init(),
    };
}

/// Turns transparent huge pages off for this process, before it allocates much:
/// the allocator (mimalloc) asks for them, and the first touch of each 2 MiB is then
/// a 2 MiB clear in one page fault on whichever thread touches it. A replica does
/// this unless `huge_pages` is set (docs/benchmarks.md, "Serving over
/// replication"); so do the processes that measure latency (the demo's clients,
/// the load generators and `sim calibrate`'s live frontends): a fresh `pangea
/// demo` spent ~100 ms of its first 250 ms clearing pages under `recvmmsg` and
/// mimalloc's page allocation, and 0.2–0.8 % of its reads missed their 20 ms
/// deadline. The simulator keeps them: it runs 4 %
/// faster with them (docs/drills.md). Children inherit the setting: a replica
/// the demo starts turns huge pages back on if its `huge_pages` says so.
pub(crate) fn no_huge_pages() {
    // Before logging is set up (the demo and the benchmarks have none).
    if let Err(e) = nix::sys::prctl::set_thp_disable(true) {
        eprintln!("cannot turn transparent huge pages off ({e}); latency may stall on page faults");
    }
}

fn main() -> std::process::ExitCode {
    quiet_on_broken_pipe();
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::Demo(_) | Command::Bench(_) | Command::BenchEcho(_) | Command::BenchRedis(_)
    ) {
        no_huge_pages();
    }
    let result = match cli.command {
        Command::Demo(args) => demo_cmd::run(args),
        Command::Bench(args) => bench_cmd::run(args),
        Command::BenchEcho(args) => bench_cmd::run_echo(args),
        Command::BenchRedis(args) => bench_cmd::run_redis(args),
        Command::BenchCeilings(args) => bench_cmd::run_ceilings(args),
        Command::Start(args) => start_cmd::start(args),
        Command::Certs(cmd) => certs_cmd::certs(cmd),
        Command::Cluster(cmd) => cluster_cmd::run(cmd),
        Command::Placement(cmd) => placement_cmd::run(cmd),
        Command::Get(a) => data_cmd::get(a),
        Command::Put(a) => data_cmd::put(a),
        Command::Incr(a) => data_cmd::incr(a),
        Command::Delete(a) => data_cmd::delete(a),
        Command::Scan(a) => data_cmd::scan(a),
        Command::Changes(a) => changes_cmd::run(a),
        Command::Backup(c) => backup_cmd::run(c),
        Command::Load(a) => load_cmd::run(a),
        Command::Watermarks(a) => data_cmd::watermarks(a),
        Command::Store(cmd) => store_cmd::run(cmd),
        Command::Topology(cmd) => topology_cmd::run(cmd),
        Command::Sim(cmd) => sim_cmd::run(cmd),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
