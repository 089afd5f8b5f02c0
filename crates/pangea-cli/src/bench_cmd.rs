//! `pangea bench`, `pangea bench-echo`, `pangea bench-redis` and `pangea
//! bench-ceilings`: flags for the harnesses of `pangea_ops::bench`, and their
//! reports.

use crate::data_cmd::{Connect, parse_consistency};
use crate::parse_duration;
use anyhow::Result;
use clap::Args;
use pangea_ops::bench::{ceilings, echo, load, redis};
use std::net::SocketAddr;

/// `pangea bench-ceilings`: this machine's limits for one core.
#[derive(Debug, Args)]
pub(crate) struct CeilingsArgs {
    /// How long each figure is measured for.
    #[arg(long, default_value = "1s")]
    each: String,
    #[arg(long)]
    json: bool,
}

pub(crate) fn run_ceilings(a: CeilingsArgs) -> Result<()> {
    let report = ceilings::run(&ceilings::Options {
        each: parse_duration(&a.each)?,
    })?;
    crate::output::print(a.json, &report)
}

/// `pangea bench-echo`: the floor.
#[derive(Debug, Args)]
pub(crate) struct EchoArgs {
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    #[arg(long, default_value = "10s")]
    duration: String,
    #[arg(long)]
    json: bool,
    /// One stream per request (`per-request`), or each worker keeps one stream and
    /// sends its requests on it one after another (`reused`, as pangea-client does).
    #[arg(long, default_value = "reused")]
    streams: String,
    /// Threads of the server's runtime and of the client's, each on its own
    /// (as a replica and `pangea bench` run): 1 (default) single-threaded, 0 one
    /// per core.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// QUIC connections, workers spread over them (as `pangea bench --connections`).
    #[arg(long, default_value_t = pangea_client::CONNECTIONS_PER_REPLICA)]
    connections: usize,
}

#[derive(Debug, Args)]
pub(crate) struct LoadArgs {
    #[command(flatten)]
    connect: Connect,
    /// get, put or mix (90 % get, 10 % put).
    #[arg(long, default_value = "get")]
    op: load::Op,
    /// Consistency of reads: eventual, affinity, bounded:MS (watermark reads use the
    /// token of each task's last write).
    #[arg(long, default_value = "eventual")]
    mode: String,
    /// Value sizes: BYTES, or lognormal:MEDIAN,SIGMA,MAX (drawn per write, e.g.
    /// lognormal:2048,1.5,1048576: a median of 2 KiB, a tail to 1 MiB).
    #[arg(long, default_value = "1024")]
    value_bytes: load::Sizes,
    /// Zipf exponent of key popularity (e.g. 0.99); 0: every key alike.
    #[arg(long, default_value_t = 0.0)]
    zipf: f64,
    /// Workers: requests in flight in a closed loop; with `--rate`, the schedules
    /// the rate is spread over, and the most requests in flight.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    #[arg(long, default_value = "10s")]
    duration: String,
    /// Distinct keys written first and then read.
    #[arg(long, default_value_t = 1_000)]
    keys: usize,
    /// Key prefix (placement rules apply: e.g. us/ homes in us-east-1).
    #[arg(long, default_value = "bench/")]
    prefix: String,
    /// Threads of the load generator: 1 (default) runs every worker on one thread,
    /// as redis-benchmark does; 0 one per core; more to load a many-core cluster.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// QUIC connections to each replica (the client's `connections_per_replica`).
    #[arg(long, default_value_t = pangea_client::CONNECTIONS_PER_REPLICA)]
    connections: usize,
    /// Operations per second over all workers, paced (an open loop): each worker
    /// sends its share on a schedule, each request at its time whatever the
    /// worker's earlier ones still wait for, and latency counts from when a request
    /// was due, so a stalled replica shows in the tail instead of slowing the load.
    /// 0 (default): a closed loop, each worker as fast as its answers come.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Write one CSV line per request of the measured load to FILE:
    /// due_ns,latency_us,op,bytes,ok (due_ns on CLOCK_MONOTONIC, as `perf record
    /// -k CLOCK_MONOTONIC`): tells one stall from many slow requests.
    #[arg(long, value_name = "FILE")]
    requests: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct RedisArgs {
    /// The Redis server.
    #[arg(long, default_value = "127.0.0.1:6379")]
    address: SocketAddr,
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    #[arg(long, default_value = "10s")]
    duration: String,
    /// Distinct keys SET first and then read.
    #[arg(long, default_value_t = 1_000)]
    keys: usize,
    /// Threads of the load generator, as `pangea bench --threads`.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(a: LoadArgs) -> Result<()> {
    let mode = match a.mode.as_str() {
        "watermark" => load::ReadMode::Watermark,
        m => load::ReadMode::Fixed(parse_consistency(m, None)?),
    };
    let mut config = a.connect.config()?;
    config.connections_per_replica = a.connections;
    let o = load::Options {
        table: a.connect.table.clone(),
        op: a.op,
        mode,
        mode_name: a.mode.clone(),
        value_sizes: a.value_bytes,
        zipf: a.zipf,
        concurrency: a.concurrency,
        duration: parse_duration(&a.duration)?,
        keys: a.keys,
        prefix: a.prefix.clone(),
        threads: a.threads,
        deadline: std::time::Duration::from_millis(a.connect.deadline_ms.unwrap_or(2_000)),
        rate: a.rate,
        requests_out: a.requests.clone(),
    };
    let report = load::run(config, &o)?;
    crate::output::print(a.connect.json, &report)
}

pub(crate) fn run_echo(a: EchoArgs) -> Result<()> {
    let reuse_streams = match a.streams.as_str() {
        "reused" => true,
        "per-request" => false,
        other => anyhow::bail!("--streams {other:?}: reused or per-request"),
    };
    let report = echo::run(&echo::Options {
        value_bytes: a.value_bytes,
        concurrency: a.concurrency,
        duration: parse_duration(&a.duration)?,
        reuse_streams,
        threads: a.threads,
        connections: a.connections,
    })?;
    crate::output::print(a.json, &report)
}

pub(crate) fn run_redis(a: RedisArgs) -> Result<()> {
    let report = redis::run(&redis::Options {
        address: a.address,
        value_bytes: a.value_bytes,
        concurrency: a.concurrency,
        duration: parse_duration(&a.duration)?,
        keys: a.keys,
        threads: a.threads,
    })?;
    crate::output::print(a.json, &report)
}
