//! Load from one region against a running cluster (`pangea bench`): the keys are
//! written first, then workers read (or write, or mix) them as fast as their answers
//! come (a closed loop) or on a schedule (an open loop, `rate`).

use super::{Figures, draws, figures, histogram, line, machine};
use anyhow::Result;
use bytes::Bytes;
use pangea_client::{
    Client, ClientConfig, Consistency, Mutation, ReadOptions, RowMutation, WriteOptions,
};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the workers send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Get,
    Put,
    /// 90 % gets, 10 % puts.
    Mix,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::Put => "put",
            Op::Mix => "mix",
        }
    }
}

impl std::str::FromStr for Op {
    type Err = String;
    fn from_str(s: &str) -> Result<Op, String> {
        match s {
            "get" => Ok(Op::Get),
            "put" => Ok(Op::Put),
            "mix" => Ok(Op::Mix),
            other => Err(format!("{other:?} is not get, put or mix")),
        }
    }
}

/// How reads are made: a consistency, or `Watermark`, which reads with the token
/// of the worker's last write (eventual until it has written).
#[derive(Debug, Clone)]
pub enum ReadMode {
    Fixed(Consistency),
    Watermark,
}

/// A load (the flags of `pangea bench`).
#[derive(Debug, Clone)]
pub struct Options {
    pub table: String,
    pub op: Op,
    pub mode: ReadMode,
    /// The mode as the caller named it, for the report.
    pub mode_name: String,
    pub value_bytes: usize,
    pub concurrency: usize,
    pub duration: Duration,
    /// Distinct keys written first and then read.
    pub keys: usize,
    /// Key prefix (placement rules apply: e.g. us/ homes in us-east-1).
    pub prefix: String,
    /// Threads of the load generator's runtime: 1 runs every worker on one thread,
    /// as redis-benchmark does; 0 one per core.
    pub threads: usize,
    /// Per-call deadline.
    pub deadline: Duration,
    /// Operations per second over all workers, paced (an open loop): latency counts
    /// from when a request was due, so a stalled replica shows in the tail instead
    /// of slowing the load. 0: a closed loop.
    pub rate: f64,
}

/// What a load measured (`pangea bench --json` prints it as is).
#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: String,
    pub op: Op,
    pub mode: String,
    pub region: String,
    pub value_bytes: usize,
    pub concurrency: usize,
    /// Paced operations per second; 0: a closed loop.
    pub rate: f64,
    pub threads: usize,
    pub duration_s: f64,
    pub reads: Figures,
    pub writes: Figures,
    pub hedges: u64,
    pub failovers: u64,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "bench {} {} from {}: {} B values, concurrency {}, {} thread(s), {:.1} s ({})",
            self.op.as_str(),
            self.mode,
            self.region,
            self.value_bytes,
            self.concurrency,
            self.threads,
            self.duration_s,
            self.machine
        )?;
        for (name, fig) in [("reads", &self.reads), ("writes", &self.writes)] {
            if fig.count > 0 || fig.errors > 0 {
                writeln!(f, "  {name:<6} {}", line(fig))?;
            }
        }
        write!(f, "  hedges {}  failovers {}", self.hedges, self.failovers)
    }
}

/// Runs the load with a client made from `config`, on a runtime of `o.threads`.
pub fn run(config: ClientConfig, o: &Options) -> Result<Report> {
    let region = config.region.to_string();
    let runtime = pangea_node::config::runtime(o.threads).build()?;
    runtime.block_on(async move {
        let client = Client::connect(config).await?;
        let keys: Arc<Vec<Bytes>> = Arc::new(
            (0..o.keys)
                .map(|i| Bytes::from(format!("{}{i:08}", o.prefix)))
                .collect(),
        );
        preload(&client, o, &keys).await?;
        let reads = Arc::new(Mutex::new(histogram()));
        let writes = Arc::new(Mutex::new(histogram()));
        let errors = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        let workers = o.concurrency.max(1);
        // Paced: worker `t` sends every `interval`, the workers staggered evenly.
        let interval = (o.rate > 0.0).then(|| Duration::from_secs_f64(workers as f64 / o.rate));
        for t in 0..workers {
            let (client, keys, o) = (client.clone(), keys.clone(), o.clone());
            let (reads, writes, errors, stop) =
                (reads.clone(), writes.clone(), errors.clone(), stop.clone());
            let value = Bytes::from(vec![b'x'; o.value_bytes]);
            tasks.spawn(async move {
                let mut draws = draws(t);
                let mut token = None;
                let mut due = interval.map(|iv| started + iv * t as u32 / workers as u32);
                let wopts = WriteOptions {
                    deadline: Some(o.deadline),
                    ..Default::default()
                };
                while !stop.load(Ordering::Relaxed) {
                    let x = draws.next_u64();
                    let key = keys[(x % keys.len() as u64) as usize].clone();
                    let write = o.op == Op::Put || (o.op == Op::Mix && x.is_multiple_of(10));
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
                        match put(&client, &o.table, key, value.clone(), &wopts).await {
                            Ok(tok) => {
                                token = Some(tok);
                                record(&writes, t0);
                            }
                            Err(_) => {
                                errors.1.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    } else {
                        let consistency = match (&o.mode, &token) {
                            (ReadMode::Watermark, Some(t)) => Consistency::Watermark(t.clone()),
                            (ReadMode::Watermark, None) => Consistency::Eventual,
                            (ReadMode::Fixed(c), _) => c.clone(),
                        };
                        let opts = ReadOptions::default()
                            .with_consistency(consistency)
                            .with_deadline(o.deadline);
                        match client.get(&o.table, key, &opts).await {
                            Ok(_) => record(&reads, t0),
                            Err(_) => {
                                errors.0.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            });
        }
        tokio::time::sleep(o.duration).await;
        stop.store(true, Ordering::Relaxed);
        while tasks.join_next().await.is_some() {}
        let elapsed = started.elapsed();
        let fig = |h: &Mutex<_>, e: &AtomicU64| {
            figures(
                &h.lock().unwrap_or_else(|p| p.into_inner()),
                e.load(Ordering::Relaxed),
                elapsed,
            )
        };
        Ok(Report {
            machine: machine(),
            op: o.op,
            mode: o.mode_name.clone(),
            region,
            value_bytes: o.value_bytes,
            concurrency: o.concurrency,
            rate: o.rate,
            threads: o.threads,
            duration_s: elapsed.as_secs_f64(),
            reads: fig(&reads, &errors.0),
            writes: fig(&writes, &errors.1),
            hedges: client.stats().hedges.load(Ordering::Relaxed),
            failovers: client.stats().failovers.load(Ordering::Relaxed),
        })
    })
}

fn record(h: &Mutex<hdrhistogram::Histogram<u64>>, t0: Instant) {
    let _ = h
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .record(t0.elapsed().as_micros() as u64);
}

/// Writes every key once, `o.concurrency` writers at a time.
async fn preload(client: &Client, o: &Options, keys: &[Bytes]) -> Result<()> {
    let value = Bytes::from(vec![b'x'; o.value_bytes]);
    let wopts = WriteOptions {
        deadline: Some(Duration::from_secs(5)),
        ..Default::default()
    };
    let mut loaders = tokio::task::JoinSet::new();
    for chunk in keys.chunks(keys.len().div_ceil(o.concurrency.max(1)).max(1)) {
        let (client, chunk, value, wopts, table) = (
            client.clone(),
            chunk.to_vec(),
            value.clone(),
            wopts.clone(),
            o.table.clone(),
        );
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
    Ok(())
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
