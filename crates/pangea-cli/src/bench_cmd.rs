//! `pangea bench`: closed-loop load from one region against a running cluster, with
//! HDR-histogram latencies; and `pangea bench echo`, the same request/response sizes
//! over a bare quinn echo server, the floor any QUIC service on this machine sees.

use crate::data_cmd::{Connect, parse_consistency};
use anyhow::{Context, Result};
use bytes::Bytes;
use clap::Args;
use hdrhistogram::Histogram;
use pangea_client::{Client, Mutation, ReadOptions, RowMutation, WriteOptions};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    op: String,
    /// Consistency of reads: eventual, affinity, bounded:MS (watermark reads use the
    /// token of each task's last write).
    #[arg(long, default_value = "eventual")]
    mode: String,
    #[arg(long, default_value_t = 1024)]
    value_bytes: usize,
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
    /// sends its share on a schedule and latency counts from when a request was
    /// due, so a stalled replica shows in the tail instead of slowing the load.
    /// 0 (default): a closed loop, each worker as fast as its answers come.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
}

/// Latency figures of one kind of operation (the bulk loader's, as it reports them).
pub(crate) use pangea_client::bulk::Latency as Figures;

pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("static bounds are valid")
}

pub(crate) fn figures(h: &Histogram<u64>, errors: u64, elapsed: Duration) -> Figures {
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
    Figures {
        count: h.len(),
        errors,
        ops_per_s: h.len() as f64 / elapsed.as_secs_f64().max(1e-9),
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        p999_ms: ms(0.999),
        max_ms: h.max() as f64 / 1e3,
    }
}

/// A worker's draws (xorshift from a per-worker seed): which key it reads next and,
/// in a mix, whether it writes. `bench` and `bench-redis` ask for the same sequence.
pub(crate) struct Draws(u64);

impl Draws {
    pub(crate) fn new(worker: usize) -> Draws {
        Draws(0x9e37_79b9_7f4a_7c15 ^ (worker as u64 + 1))
    }

    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration> {
    pangea_topology::placement::parse_duration_ms(s)
        .map(Duration::from_millis)
        .with_context(|| format!("duration {s:?}: like 500ms, 10s, 5m"))
}

#[derive(Debug, Serialize)]
struct Report {
    machine: String,
    op: String,
    mode: String,
    region: String,
    value_bytes: usize,
    concurrency: usize,
    /// Paced operations per second; 0: a closed loop.
    rate: f64,
    threads: usize,
    duration_s: f64,
    reads: Figures,
    writes: Figures,
    hedges: u64,
    failovers: u64,
}

pub(crate) fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores, {cpu}")
}

pub(crate) fn run_echo(a: EchoArgs) -> Result<()> {
    let reuse = match a.streams.as_str() {
        "reused" => true,
        "per-request" => false,
        other => anyhow::bail!("--streams {other:?}: reused or per-request"),
    };
    echo(
        a.value_bytes,
        a.concurrency,
        parse_duration(&a.duration)?,
        a.json,
        reuse,
        a.threads,
        a.connections.max(1),
    )
}

pub(crate) fn run(a: LoadArgs) -> Result<()> {
    let duration = parse_duration(&a.duration)?;
    let runtime = pangea_node::config::runtime(a.threads).build()?;
    runtime.block_on(async move {
        let mut config = a.connect.config()?;
        config.connections_per_replica = a.connections;
        let client = Client::connect(config).await?;
        let value = Bytes::from(vec![b'x'; a.value_bytes]);
        // Load the keys first (concurrently).
        let keys: Vec<Bytes> = (0..a.keys).map(|i| Bytes::from(format!("{}{i:08}", a.prefix))).collect();
        let wopts = WriteOptions { deadline: Some(Duration::from_secs(5)), ..Default::default() };
        let mut loaders = tokio::task::JoinSet::new();
        for chunk in keys.chunks(a.keys.div_ceil(a.concurrency.max(1)).max(1)) {
            let (client, chunk, value, wopts, table) = (client.clone(), chunk.to_vec(), value.clone(), wopts.clone(), a.connect.table.clone());
            loaders.spawn(async move {
                for k in chunk {
                    put(&client, &table, k, value.clone(), &wopts).await?;
                }
                anyhow::Ok(())
            });
        }
        while let Some(r) = loaders.join_next().await {
            r??;
        }
        let reads = Arc::new(Mutex::new(histogram()));
        let writes = Arc::new(Mutex::new(histogram()));
        let errors = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        // Paced: worker `t` sends every `interval`, the workers staggered evenly.
        let interval = (a.rate > 0.0).then(|| Duration::from_secs_f64(a.concurrency.max(1) as f64 / a.rate));
        for t in 0..a.concurrency {
            let (client, keys, value) = (client.clone(), keys.clone(), value.clone());
            let (reads, writes, errors, stop) = (reads.clone(), writes.clone(), errors.clone(), stop.clone());
            let (op, mode, table, deadline) = (a.op.clone(), a.mode.clone(), a.connect.table.clone(), a.connect.deadline_ms.unwrap_or(2_000));
            let concurrency = a.concurrency.max(1) as u32;
            tasks.spawn(async move {
                let mut draws = Draws::new(t);
                let mut token = None;
                let mut due = interval.map(|iv| started + iv * t as u32 / concurrency);
                while !stop.load(Ordering::Relaxed) {
                    let x = draws.next();
                    let key = keys[(x % keys.len() as u64) as usize].clone();
                    let write = op == "put" || (op == "mix" && x.is_multiple_of(10));
                    // Latency from when the request was due (paced) or sent.
                    let t0 = match (due.as_mut(), interval) {
                        (Some(at), Some(iv)) => {
                            tokio::time::sleep_until((*at).into()).await;
                            let was = *at;
                            *at += iv;
                            was
                        }
                        _ => Instant::now(),
                    };
                    if write {
                        match put(&client, &table, key, value.clone(), &WriteOptions { deadline: Some(Duration::from_millis(deadline)), ..Default::default() }).await {
                            Ok(tok) => {
                                token = Some(tok);
                                let _ = writes.lock().expect("not poisoned").record(t0.elapsed().as_micros() as u64);
                            }
                            Err(_) => {
                                errors.1.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    } else {
                        let consistency = match (mode.as_str(), &token) {
                            ("watermark", Some(t)) => pangea_client::Consistency::Watermark(t.clone()),
                            ("watermark", None) => pangea_client::Consistency::Eventual,
                            (m, _) => parse_consistency(m, None).unwrap_or(pangea_client::Consistency::Eventual),
                        };
                        let opts = ReadOptions::default().with_consistency(consistency).with_deadline(Duration::from_millis(deadline));
                        match client.get(&table, key, &opts).await {
                            Ok(_) => {
                                let _ = reads.lock().expect("not poisoned").record(t0.elapsed().as_micros() as u64);
                            }
                            Err(_) => {
                                errors.0.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            });
        }
        tokio::time::sleep(duration).await;
        stop.store(true, Ordering::Relaxed);
        while tasks.join_next().await.is_some() {}
        let elapsed = started.elapsed();
        let report = Report {
            machine: machine(),
            op: a.op.clone(),
            mode: a.mode.clone(),
            region: a.connect.region.clone(),
            value_bytes: a.value_bytes,
            concurrency: a.concurrency,
            rate: a.rate,
            threads: a.threads,
            duration_s: elapsed.as_secs_f64(),
            reads: figures(&reads.lock().expect("not poisoned"), errors.0.load(Ordering::Relaxed), elapsed),
            writes: figures(&writes.lock().expect("not poisoned"), errors.1.load(Ordering::Relaxed), elapsed),
            hedges: client.stats().hedges.load(Ordering::Relaxed),
            failovers: client.stats().failovers.load(Ordering::Relaxed),
        };
        if a.connect.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            println!("bench {} {} from {}: {} B values, concurrency {}, {} thread(s), {:.1} s ({})", report.op, report.mode, report.region, report.value_bytes, report.concurrency, report.threads, report.duration_s, report.machine);
            for (name, f) in [("reads", &report.reads), ("writes", &report.writes)] {
                if f.count > 0 || f.errors > 0 {
                    println!(
                        "  {name:<6} {:>10.0} ops/s  p50 {:>7.3} ms  p99 {:>7.3} ms  p999 {:>7.3} ms  max {:>8.3} ms  errors {}",
                        f.ops_per_s, f.p50_ms, f.p99_ms, f.p999_ms, f.max_ms, f.errors
                    );
                }
            }
            println!("  hedges {}  failovers {}", report.hedges, report.failovers);
        }
        Ok(())
    })
}

async fn put(
    client: &Client,
    table: &str,
    key: Bytes,
    value: Bytes,
    opts: &WriteOptions,
) -> Result<pangea_client::Token> {
    let m = Mutation::SetCell {
        family: "profile".into(),
        column: Bytes::from_static(b"p"),
        value,
    };
    let mutation = RowMutation::new(table, key, vec![m], &pangea_core::Limits::default())?;
    Ok(client.mutate(mutation, opts).await?.value)
}

/// The echo floor: a bare quinn server that returns each request's payload.
fn echo(
    value_bytes: usize,
    concurrency: usize,
    duration: Duration,
    json: bool,
    reuse: bool,
    threads: usize,
    connections: usize,
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    pangea_net::certs::init_ca(dir.path())?;
    pangea_net::certs::issue_replica(dir.path(), "echo", "local")?;
    pangea_net::certs::issue_client(dir.path(), "bench", "frontend")?;
    let ca = pangea_net::certs::load_ca(dir.path())?;
    let server =
        pangea_net::tls::server_config(&ca, pangea_net::certs::load_replica(dir.path(), "echo")?)?;
    let client =
        pangea_net::tls::client_config(&ca, pangea_net::certs::load_client(dir.path(), "bench")?)?;
    let client2 =
        pangea_net::tls::client_config(&ca, pangea_net::certs::load_client(dir.path(), "bench")?)?;
    // The server on a thread and runtime of its own, as a replica process has.
    let server_runtime = pangea_node::config::runtime(threads).build()?;
    let server_ep = server_runtime.block_on(async {
        pangea_net::bind_endpoint(
            ([127, 0, 0, 1], 0).into(),
            Some(server),
            client2,
            None,
            None,
        )
    })?;
    let addr = server_ep.local_addr()?;
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let server_thread = std::thread::spawn(move || {
        server_runtime.block_on(async move {
            tokio::select! {
                // Every request frame comes back as the answer.
                _ = async move {
            while let Some(inc) = server_ep.accept().await {
                tokio::spawn(async move {
                    let Ok(conn) = inc.await else { return };
                    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                        tokio::spawn(async move {
                            while let Ok(Some(req)) = pangea_net::read_frame::<pangea_proto::v1::ClientRequest>(&mut recv, pangea_net::FRAME_BYTES_MAX).await {
                                if pangea_net::write_frame(&mut send, &req).await.is_err() {
                                    return;
                                }
                            }
                            let _ = send.finish();
                        });
                    }
                });
            }
                } => {}
                _ = server_stopped => {}
            }
        });
    });
    let runtime = pangea_node::config::runtime(threads).build()?;
    let result = runtime.block_on(async move {
        let ep = pangea_net::bind_endpoint(([127, 0, 0, 1], 0).into(), None, client, None, None)?;
        let mut conns = Vec::with_capacity(connections);
        for _ in 0..connections {
            conns.push(ep.connect(addr, "echo")?.await?);
        }
        let payload = Bytes::from(vec![b'x'; value_bytes]);
        let req = pangea_proto::v1::ClientRequest {
            deadline_us: 0,
            app_profile: String::new(),
            traceparent: String::new(),
            request: Some(pangea_proto::v1::client_request::Request::Get(pangea_proto::v1::GetRequest {
                table: "t".into(),
                row_key: payload,
                ..Default::default()
            })),
        };
        let hist = Arc::new(Mutex::new(histogram()));
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..concurrency {
            let (conn, req, hist, stop) = (conns[i % connections].clone(), req.clone(), hist.clone(), stop.clone());
            tasks.spawn(async move {
                let mut kept = None;
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    let (mut send, mut recv) = match kept.take() {
                        Some(s) => s,
                        None => match conn.open_bi().await {
                            Ok(s) => s,
                            Err(_) => return,
                        },
                    };
                    if pangea_net::write_frame(&mut send, &req).await.is_err() {
                        return;
                    }
                    if !reuse {
                        let _ = send.finish();
                    }
                    if let Ok(Some(_)) = pangea_net::read_frame::<pangea_proto::v1::ClientRequest>(&mut recv, pangea_net::FRAME_BYTES_MAX).await {
                        let _ = hist.lock().expect("not poisoned").record(t0.elapsed().as_micros() as u64);
                    }
                    if reuse {
                        kept = Some((send, recv));
                    }
                }
            });
        }
        tokio::time::sleep(duration).await;
        stop.store(true, Ordering::Relaxed);
        while tasks.join_next().await.is_some() {}
        let f = figures(&hist.lock().expect("not poisoned"), 0, started.elapsed());
        if json {
            println!("{}", serde_json::to_string_pretty(&serde_json::json!({"machine": machine(), "value_bytes": value_bytes, "concurrency": concurrency, "connections": connections, "streams": if reuse { "reused" } else { "per-request" }, "echo": f}))?);
        } else {
            println!(
                "echo {value_bytes} B, concurrency {concurrency}, {} streams ({}): {:.0} ops/s  p50 {:.3} ms  p99 {:.3} ms  p999 {:.3} ms",
                if reuse { "reused" } else { "per-request" },
                machine(),
                f.ops_per_s,
                f.p50_ms,
                f.p99_ms,
                f.p999_ms
            );
        }
        Ok(())
    });
    let _ = stop_server.send(());
    let _ = server_thread.join();
    result
}
