//! Load from one region against a running cluster (`pangea bench`): the keys are
//! written first, then workers read (or write, or mix) them as fast as their answers
//! come (a closed loop) or on a schedule (an open loop, `rate`).

use super::{Figures, draws, figures, histogram, line, machine};
use anyhow::Result;
use bytes::Bytes;
use pangea_client::{
    Client, ClientConfig, Consistency, Mutation, ReadOptions, RowMutation, WriteOptions,
};
use pangea_core::frontend;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
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

/// The sizes of the values written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sizes {
    /// Every value this long.
    Fixed(usize),
    /// Log-normal: `median` bytes, `sigma` the spread of the size's logarithm,
    /// cut at `max` (ad profiles: a few KiB, a tail to 1 MiB).
    LogNormal {
        median: usize,
        sigma: f64,
        max: usize,
    },
}

impl Sizes {
    /// The longest value it draws.
    pub fn max(self) -> usize {
        match self {
            Sizes::Fixed(n) => n,
            Sizes::LogNormal { max, .. } => max,
        }
    }

    /// One size (Box–Muller for the normal draw).
    fn draw(self, rng: &mut pangea_core::rng::Rng) -> usize {
        match self {
            Sizes::Fixed(n) => n,
            Sizes::LogNormal { median, sigma, max } => {
                let (u1, u2) = (1.0 - rng.next_f64(), rng.next_f64());
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                ((median as f64 * (sigma * z).exp()) as usize).clamp(1, max)
            }
        }
    }
}

impl std::fmt::Display for Sizes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sizes::Fixed(n) => write!(f, "{n}"),
            Sizes::LogNormal { median, sigma, max } => {
                write!(f, "lognormal:{median},{sigma},{max}")
            }
        }
    }
}

impl std::str::FromStr for Sizes {
    type Err = String;
    /// `N` (bytes) or `lognormal:MEDIAN,SIGMA,MAX`.
    fn from_str(s: &str) -> Result<Sizes, String> {
        let bad = || {
            format!(
                "{s:?} is not BYTES or lognormal:MEDIAN,SIGMA,MAX (e.g. lognormal:2048,1.5,1048576)"
            )
        };
        match s.strip_prefix("lognormal:") {
            None => s.parse().map(Sizes::Fixed).map_err(|_| bad()),
            Some(rest) => {
                let parts: Vec<&str> = rest.split(',').collect();
                let [median, sigma, max] = parts[..] else {
                    return Err(bad());
                };
                let (median, sigma, max) = (
                    median.parse::<usize>().map_err(|_| bad())?,
                    sigma.parse::<f64>().map_err(|_| bad())?,
                    max.parse::<usize>().map_err(|_| bad())?,
                );
                if median == 0 || median > max || !(sigma.is_finite() && sigma >= 0.0) {
                    return Err(format!("{s:?}: need 0 < MEDIAN <= MAX and SIGMA >= 0"));
                }
                Ok(Sizes::LogNormal { median, sigma, max })
            }
        }
    }
}

/// Which key each operation takes: uniformly, or by a Zipf law of exponent `s`
/// over the keys' ranks (a few hot keys, a long tail).
#[derive(Debug, Clone)]
struct KeyChooser {
    /// Cumulative weights, for Zipf; empty for uniform.
    cdf: Vec<f64>,
}

impl KeyChooser {
    fn new(keys: usize, zipf: f64) -> KeyChooser {
        if zipf <= 0.0 {
            return KeyChooser { cdf: Vec::new() };
        }
        let mut total = 0.0;
        let mut cdf: Vec<f64> = (1..=keys)
            .map(|rank| {
                total += (rank as f64).powf(-zipf);
                total
            })
            .collect();
        cdf.iter_mut().for_each(|c| *c /= total);
        KeyChooser { cdf }
    }

    fn pick(&self, keys: usize, rng: &mut pangea_core::rng::Rng) -> usize {
        match self.cdf.is_empty() {
            true => (rng.next_u64() % keys as u64) as usize,
            false => {
                let u = rng.next_f64();
                self.cdf.partition_point(|c| *c < u).min(keys - 1)
            }
        }
    }
}

/// A load (the flags of `pangea bench`).
#[derive(Debug, Clone)]
pub struct Options {
    pub table: String,
    pub op: Op,
    pub mode: ReadMode,
    /// The mode as the caller named it, for the report.
    pub mode_name: String,
    /// Sizes of the values written (preloaded and put).
    pub value_sizes: Sizes,
    /// Zipf exponent of key popularity; 0: uniform.
    pub zipf: f64,
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
    /// Operations per second over all workers, paced (an open loop): each request
    /// goes out at its time, not after the worker's earlier ones (a read is not
    /// held behind a slow write), at most `concurrency` in flight; latency counts
    /// from when it was due, so a stalled replica shows in the tail instead of
    /// slowing the load. 0: a closed loop.
    pub rate: f64,
    /// Where to write one line per request (`RequestLog`); none by default.
    pub requests_out: Option<PathBuf>,
}

/// What a load measured (`pangea bench --json` prints it as is).
#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: String,
    pub op: Op,
    pub mode: String,
    pub region: String,
    /// The longest value written (every value, unless `value_sizes` draws them).
    pub value_bytes: usize,
    /// The value sizes: bytes, or `lognormal:MEDIAN,SIGMA,MAX`.
    pub value_sizes: String,
    /// Zipf exponent of key popularity; 0: uniform.
    pub zipf: f64,
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
            "bench {} {} from {}: {} B values, zipf {}, concurrency {}, {} thread(s), {:.1} s ({})",
            self.op.as_str(),
            self.mode,
            self.region,
            self.value_sizes,
            self.zipf,
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
    // Before anything is sent: a path that cannot be written stops the load first.
    let requests = match &o.requests_out {
        Some(path) => Some(Mutex::new(RequestLog::create(path)?)),
        None => None,
    };
    let runtime = pangea_node::config::runtime(o.threads).build()?;
    runtime.block_on(async move {
        let client = Client::connect(config).await?;
        let keys: Arc<Vec<Bytes>> = Arc::new(
            (0..o.keys)
                .map(|i| Bytes::from(format!("{}{i:08}", o.prefix)))
                .collect(),
        );
        preload(&client, o, &keys).await?;
        let chooser = Arc::new(KeyChooser::new(keys.len(), o.zipf));
        // Values are slices of one buffer as long as the longest.
        let values = Bytes::from(vec![b'x'; o.value_sizes.max()]);
        let ctx = Arc::new(Ctx {
            client: client.clone(),
            o: o.clone(),
            reads: Mutex::new(histogram()),
            writes: Mutex::new(histogram()),
            errors: (AtomicU64::new(0), AtomicU64::new(0)),
            requests,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        let workers = o.concurrency.max(1);
        // Paced: worker `t` sends every `interval`, the workers staggered evenly;
        // each request goes out at its time whatever the worker's earlier ones are
        // still waiting for (a read is not held behind a slow write), at most
        // `concurrency` in flight in all.
        let interval = (o.rate > 0.0).then(|| Duration::from_secs_f64(workers as f64 / o.rate));
        let in_flight = Arc::new(tokio::sync::Semaphore::new(workers));
        for t in 0..workers {
            let (ctx, keys, chooser, values, stop, in_flight) = (
                ctx.clone(),
                keys.clone(),
                chooser.clone(),
                values.clone(),
                stop.clone(),
                in_flight.clone(),
            );
            tasks.spawn(async move {
                let o = &ctx.o;
                let mut draws = draws(t);
                let token = Arc::new(Mutex::new(None));
                let mut due = interval.map(|iv| started + iv * t as u32 / workers as u32);
                let mut sent = tokio::task::JoinSet::new();
                while !stop.load(Ordering::Relaxed) {
                    let key = keys[chooser.pick(keys.len(), &mut draws)].clone();
                    let write =
                        o.op == Op::Put || (o.op == Op::Mix && draws.next_u64().is_multiple_of(10));
                    let value = write.then(|| values.slice(..o.value_sizes.draw(&mut draws)));
                    match (due.as_mut(), interval) {
                        // Latency from when the request was due, or from when it
                        // went out if that was earlier: tokio's timers fire on the
                        // first 1 ms tick at or after their deadline, so aiming half
                        // a tick early sends within ±0.5 ms of the due time instead
                        // of 0–1 ms late, and an early request still counts its
                        // whole wait.
                        (Some(at), Some(iv)) => {
                            tokio::time::sleep_until((*at - frontend::TIMER_TICK / 2).into()).await;
                            let t0 = (*at).min(Instant::now());
                            *at += iv;
                            let Ok(permit) = in_flight.clone().acquire_owned().await else {
                                break;
                            };
                            let (ctx, token) = (ctx.clone(), token.clone());
                            sent.spawn(async move {
                                ctx.send(key, value, &token, t0).await;
                                drop(permit);
                            });
                            // Reap the finished ones as we go.
                            while sent.try_join_next().is_some() {}
                        }
                        // Latency from when it was sent.
                        _ => ctx.send(key, value, &token, Instant::now()).await,
                    }
                }
                while sent.join_next().await.is_some() {}
            });
        }
        tokio::time::sleep(o.duration).await;
        stop.store(true, Ordering::Relaxed);
        while tasks.join_next().await.is_some() {}
        let elapsed = started.elapsed();
        if let Some(log) = &ctx.requests {
            log.lock().unwrap_or_else(|p| p.into_inner()).finish()?;
        }
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
            value_bytes: o.value_sizes.max(),
            value_sizes: o.value_sizes.to_string(),
            zipf: o.zipf,
            concurrency: o.concurrency,
            rate: o.rate,
            threads: o.threads,
            duration_s: elapsed.as_secs_f64(),
            reads: fig(&ctx.reads, &ctx.errors.0),
            writes: fig(&ctx.writes, &ctx.errors.1),
            hedges: client.stats().hedges.load(Ordering::Relaxed),
            failovers: client.stats().failovers.load(Ordering::Relaxed),
        })
    })
}

/// What every request of a load shares: the client, the load's options, and
/// what it measured.
struct Ctx {
    client: Client,
    o: Options,
    reads: Mutex<hdrhistogram::Histogram<u64>>,
    writes: Mutex<hdrhistogram::Histogram<u64>>,
    /// Failed reads, failed writes.
    errors: (AtomicU64, AtomicU64),
    /// One line per request, when asked for.
    requests: Option<Mutex<RequestLog>>,
}

impl Ctx {
    /// One request: a put of `value`, or a get; its latency counted from `t0`.
    /// `token`: the worker's last write's, for watermark reads.
    async fn send(
        &self,
        key: Bytes,
        value: Option<Bytes>,
        token: &Mutex<Option<pangea_client::Token>>,
        t0: Instant,
    ) {
        let o = &self.o;
        match value {
            Some(value) => {
                let wopts = WriteOptions {
                    deadline: Some(o.deadline),
                    ..Default::default()
                };
                let bytes = value.len();
                match put(&self.client, &o.table, key, value, &wopts).await {
                    Ok(tok) => {
                        *token.lock().unwrap_or_else(|p| p.into_inner()) = Some(tok);
                        self.done(&self.writes, t0, Op::Put, bytes);
                    }
                    Err(_) => {
                        self.errors.1.fetch_add(1, Ordering::Relaxed);
                        self.log(t0, t0.elapsed(), Op::Put, bytes, false);
                    }
                }
            }
            None => {
                // Only watermark reads look at the worker's last token.
                let consistency = match &o.mode {
                    ReadMode::Fixed(c) => c.clone(),
                    ReadMode::Watermark => {
                        match token.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                            Some(t) => Consistency::Watermark(t),
                            None => Consistency::Eventual,
                        }
                    }
                };
                let opts = ReadOptions::default()
                    .with_consistency(consistency)
                    .with_deadline(o.deadline);
                match self.client.get(&o.table, key, &opts).await {
                    Ok(r) => {
                        let bytes = r.value.as_ref().map_or(0, |row| {
                            row.families
                                .iter()
                                .flat_map(|f| &f.cells)
                                .map(|c| c.value.len())
                                .sum()
                        });
                        self.done(&self.reads, t0, Op::Get, bytes);
                    }
                    Err(_) => {
                        self.errors.0.fetch_add(1, Ordering::Relaxed);
                        self.log(t0, t0.elapsed(), Op::Get, 0, false);
                    }
                }
            }
        }
    }

    /// A request answered: its latency from `t0` into `h`, and into the log.
    fn done(&self, h: &Mutex<hdrhistogram::Histogram<u64>>, t0: Instant, op: Op, bytes: usize) {
        let latency = t0.elapsed();
        let _ = h
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(latency.as_micros() as u64);
        self.log(t0, latency, op, bytes, true);
    }

    /// One line of the request log, when there is one.
    fn log(&self, t0: Instant, latency: Duration, op: Op, bytes: usize, ok: bool) {
        if let Some(log) = &self.requests {
            log.lock()
                .unwrap_or_else(|p| p.into_inner())
                .line(t0, latency, op, bytes, ok);
        }
    }
}

/// One CSV line per request of the measured load (`pangea bench --requests
/// FILE`): `due_ns,latency_us,op,bytes,ok`. `due_ns` is when the request was due
/// (sent, in a closed loop) on the machine's `CLOCK_MONOTONIC`, the clock `perf
/// record -k CLOCK_MONOTONIC` stamps its samples with, so a stall the load saw
/// can be laid beside what the replica's threads did then; `latency_us` counts
/// from then, as the histograms do; `bytes` is the value written, or the values
/// read; `ok` is 0 for a request that failed. A histogram says how long the tail
/// is; these lines say whether it is many slow requests or one stall that every
/// request in a window waited for, and which values it came with.
struct RequestLog {
    out: std::io::BufWriter<std::fs::File>,
    path: PathBuf,
    /// The same moment on both clocks.
    start: (Instant, Duration),
    /// The first write error; later lines are dropped.
    failed: Option<std::io::Error>,
}

impl RequestLog {
    fn create(path: &std::path::Path) -> Result<RequestLog> {
        use anyhow::Context as _;
        let file = std::fs::File::create(path)
            .with_context(|| format!("creating the request log {}", path.display()))?;
        let mono = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .context("reading CLOCK_MONOTONIC for the request log")?;
        let mut log = RequestLog {
            out: std::io::BufWriter::new(file),
            path: path.to_owned(),
            start: (Instant::now(), Duration::from(mono)),
            failed: None,
        };
        if let Err(e) = writeln!(log.out, "due_ns,latency_us,op,bytes,ok") {
            log.failed = Some(e);
        }
        Ok(log)
    }

    fn line(&mut self, due: Instant, latency: Duration, op: Op, bytes: usize, ok: bool) {
        if self.failed.is_some() {
            return;
        }
        let (at, mono) = self.start;
        // Every request is due after the log was made.
        let due_ns = (mono + due.saturating_duration_since(at)).as_nanos();
        let latency_us = latency.as_micros();
        if let Err(e) = writeln!(
            self.out,
            "{due_ns},{latency_us},{},{bytes},{}",
            op.as_str(),
            u8::from(ok)
        ) {
            self.failed = Some(e);
        }
    }

    fn finish(&mut self) -> Result<()> {
        let flushed = match self.failed.take() {
            Some(e) => Err(e),
            None => self.out.flush(),
        };
        flushed.map_err(|e| anyhow::anyhow!("writing the request log {}: {e}", self.path.display()))
    }
}

/// Writes every key once (a value of a drawn size), then reads each once,
/// `o.concurrency` at a time.
async fn preload(client: &Client, o: &Options, keys: &[Bytes]) -> Result<()> {
    let values = Bytes::from(vec![b'x'; o.value_sizes.max()]);
    let wopts = WriteOptions {
        deadline: Some(Duration::from_secs(5)),
        ..Default::default()
    };
    let mut loaders = tokio::task::JoinSet::new();
    let per = keys.len().div_ceil(o.concurrency.max(1)).max(1);
    for (n, chunk) in keys.chunks(per).enumerate() {
        let (client, chunk, values, wopts, table, sizes) = (
            client.clone(),
            chunk.to_vec(),
            values.clone(),
            wopts.clone(),
            o.table.clone(),
            o.value_sizes,
        );
        // Draws of their own: the workers' later draws do not depend on the preload.
        let mut draws = draws(usize::MAX - n);
        loaders.spawn(async move {
            for k in chunk {
                let value = values.slice(..sizes.draw(&mut draws));
                put(&client, &table, k, value, &wopts).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = loaders.join_next().await {
        r??;
    }
    // Then every key read once, as a long-running replica's reads would have: the
    // measured window starts with the row cache as warm as it gets, not with a
    // first read of each row going to the store.
    let ropts = ReadOptions::default().with_deadline(Duration::from_secs(5));
    for chunk in keys.chunks(per) {
        let (client, chunk, table, ropts) = (
            client.clone(),
            chunk.to_vec(),
            o.table.clone(),
            ropts.clone(),
        );
        loaders.spawn(async move {
            for k in chunk {
                client.get(&table, k, &ropts).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_sizes_parse_or_say_what_is_wrong() {
        assert_eq!("1024".parse(), Ok(Sizes::Fixed(1024)));
        assert_eq!(
            "lognormal:2048,1.5,1048576".parse(),
            Ok(Sizes::LogNormal {
                median: 2048,
                sigma: 1.5,
                max: 1 << 20
            })
        );
        for bad in [
            "",
            "lognormal:2048,1.5",
            "lognormal:0,1,10",
            "lognormal:20,-1,10",
            "x",
        ] {
            let e = bad.parse::<Sizes>().unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }

    /// Log-normal sizes have the median asked for, stay within the cut, and
    /// reach far above the median (the tail); Zipf keys favour the first ranks
    /// as 1/rank^s says.
    #[test]
    fn sizes_and_keys_follow_their_laws() {
        let mut rng = pangea_core::rng::Rng::new(7);
        let sizes = Sizes::LogNormal {
            median: 2048,
            sigma: 1.5,
            max: 1 << 20,
        };
        let mut drawn: Vec<usize> = (0..20_000).map(|_| sizes.draw(&mut rng)).collect();
        drawn.sort_unstable();
        let median = drawn[drawn.len() / 2];
        assert!((1_850..2_250).contains(&median), "median {median}");
        assert!(
            drawn[drawn.len() * 999 / 1000] > 100 * 1024,
            "p99.9 {}",
            drawn[drawn.len() * 999 / 1000]
        );
        assert!(*drawn.last().unwrap() <= 1 << 20 && drawn[0] >= 1);
        let keys = KeyChooser::new(1_000, 0.99);
        let mut hits = [0u32; 1_000];
        for _ in 0..100_000 {
            hits[keys.pick(1_000, &mut rng)] += 1;
        }
        // P(rank 1) = 1 / sum(1/r^0.99) ≈ 0.13; rank 2 about half of it.
        assert!((12_000..14_500).contains(&hits[0]), "rank 1: {}", hits[0]);
        assert!((hits[1] as f64 / hits[0] as f64 - 0.5).abs() < 0.05);
        let uniform = KeyChooser::new(1_000, 0.0);
        let mut hits = [0u32; 1_000];
        for _ in 0..100_000 {
            hits[uniform.pick(1_000, &mut rng)] += 1;
        }
        assert!(hits.iter().all(|h| (40..170).contains(h)));
    }
}
