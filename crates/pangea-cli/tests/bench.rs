//! `pangea bench` on a one-replica local cluster: an open-loop mix with a
//! request log (`--requests`). Every request the report counts has its line, the
//! lines' latencies give the report's percentiles, their due times span the run
//! on the machine's monotonic clock, and a log that cannot be written stops the
//! load before anything is sent, naming the path.

mod common;

use anyhow::{Context, Result, ensure};
use common::{Cluster, pangea};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);
const MAX_VALUE: usize = 65_536;

/// One line of the request log.
struct Line {
    due_ns: u128,
    latency_us: u64,
    op: String,
    bytes: usize,
    ok: bool,
}

fn parse(text: &str) -> Result<Vec<Line>> {
    let mut lines = text.lines();
    ensure!(
        lines.next() == Some("due_ns,latency_us,op,bytes,ok"),
        "header of {text:.80}"
    );
    lines
        .enumerate()
        .map(|(i, l)| {
            let f: Vec<&str> = l.split(',').collect();
            ensure!(f.len() == 5, "line {}: {l}", i + 2);
            Ok(Line {
                due_ns: f[0]
                    .parse()
                    .with_context(|| format!("line {}: {l}", i + 2))?,
                latency_us: f[1]
                    .parse()
                    .with_context(|| format!("line {}: {l}", i + 2))?,
                op: f[2].to_owned(),
                bytes: f[3]
                    .parse()
                    .with_context(|| format!("line {}: {l}", i + 2))?,
                ok: f[4] == "1",
            })
        })
        .collect()
}

/// The q-quantile of `v` as an HDR histogram reports it (the smallest value at
/// or above which a share 1 - q lies), in ms.
fn quantile_ms(v: &mut [u64], q: f64) -> f64 {
    v.sort_unstable();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1] as f64 / 1_000.0
}

fn monotonic_ns() -> Result<u128> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)?;
    Ok(Duration::from(t).as_nanos())
}

#[test]
fn the_request_log_has_a_line_per_request_and_agrees_with_the_report() -> Result<()> {
    let cluster = Cluster::up_with(
        "topology/single-replica.toml",
        "topology/single-replica.placement.toml",
        false,
    )?;
    let cluster_file = cluster.cluster_path();
    let cluster_file = cluster_file.to_str().context("cluster path")?;
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("requests.csv");
    let sizes = format!("lognormal:2048,1.5,{MAX_VALUE}");
    let bench = |requests: &str| {
        pangea(
            &[
                "bench",
                "--cluster",
                cluster_file,
                "--region",
                "local-1",
                "--op",
                "mix",
                "--value-bytes",
                &sizes,
                "--zipf",
                "0.99",
                "--keys",
                "200",
                "--concurrency",
                "16",
                "--duration",
                "2s",
                "--rate",
                "400",
                "--requests",
                requests,
                "--json",
            ],
            LIMIT,
        )
    };

    let before = monotonic_ns()?;
    let out = bench(log.to_str().context("log path")?)?;
    let after = monotonic_ns()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let lines = parse(&std::fs::read_to_string(&log)?)?;

    let figure = |side: &str, field: &str| report[side][field].as_f64().unwrap_or(f64::NAN);
    let (reads, writes) = (figure("reads", "count"), figure("writes", "count"));
    let errors = figure("reads", "errors") + figure("writes", "errors");
    let ok = |op: &str| lines.iter().filter(|l| l.ok && l.op == op).count() as f64;
    ensure!(
        (ok("get"), ok("put")) == (reads, writes),
        "lines {} gets, {} puts; the report {reads} reads, {writes} writes",
        ok("get"),
        ok("put")
    );
    ensure!(
        lines.iter().filter(|l| !l.ok).count() as f64 == errors,
        "failed lines against {errors} errors"
    );
    // The mix: about a tenth writes, at the paced rate.
    ensure!(
        reads > 4.0 * writes && writes > 0.0,
        "{reads} reads, {writes} writes"
    );
    ensure!(
        lines.len() > 600,
        "{} requests at 400/s for 2 s",
        lines.len()
    );

    // Every value within its law's cut; reads of written rows carry bytes.
    for l in &lines {
        ensure!(l.op == "get" || l.op == "put", "op {}", l.op);
        ensure!(l.bytes <= MAX_VALUE, "{} bytes above the cut", l.bytes);
        ensure!(l.op == "get" || l.bytes > 0, "an empty put");
    }
    ensure!(
        lines.iter().any(|l| l.op == "get" && l.bytes > 0),
        "no read carried a value"
    );

    // Due times on CLOCK_MONOTONIC, within the command's run, spanning the load.
    let (first, last) = lines.iter().fold((u128::MAX, 0), |(a, b), l| {
        (a.min(l.due_ns), b.max(l.due_ns))
    });
    ensure!(
        before <= first && last <= after,
        "due times {first}..{last} outside {before}..{after}"
    );
    let span = Duration::from_nanos((last - first) as u64);
    ensure!(
        span >= Duration::from_millis(1_500) && span <= Duration::from_millis(2_500),
        "due times span {span:?} of a 2 s load"
    );

    // The lines' percentiles are the report's (HDR keeps 3 significant digits).
    for (side, op) in [("reads", "get"), ("writes", "put")] {
        let mut lat: Vec<u64> = lines
            .iter()
            .filter(|l| l.ok && l.op == op)
            .map(|l| l.latency_us)
            .collect();
        for (field, q) in [("p50_ms", 0.5), ("p99_ms", 0.99)] {
            let (mine, theirs) = (quantile_ms(&mut lat, q), figure(side, field));
            ensure!(
                (mine - theirs).abs() <= 0.01 * theirs + 0.002,
                "{side} {field}: lines {mine} ms, report {theirs} ms"
            );
        }
    }

    // A log that cannot be written: refused before the load, the path named.
    let bad = dir.path().join("no-such-dir").join("requests.csv");
    let started = Instant::now();
    let out = bench(bad.to_str().context("bad path")?)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "an unwritable log was accepted");
    ensure!(
        stderr.contains("no-such-dir"),
        "the error does not name the path: {stderr}"
    );
    ensure!(
        started.elapsed() < Duration::from_secs(2),
        "it ran the load first"
    );
    cluster.down(2_000)?;
    Ok(())
}
