//! `pangea sim calibrate` end to end: the simulator and a live local cluster with
//! emulated WAN run the same short workload, and the report holds both sides' figures
//! for every region, mode and replication pair. (How close they are is measured and
//! explained in docs/drills.md, not asserted here: a loaded test machine is not the
//! machine the figures are for.)

mod common;

use anyhow::{Context, Result, ensure};
use std::time::Duration;

/// The local three-region topology and placement, as `pangea sim calibrate`'s
/// `--topology` and `--placement` arguments.
fn local_3_regions() -> Result<[String; 4]> {
    let path = |file| {
        common::repo_file(file)
            .to_str()
            .map(str::to_owned)
            .context("path")
    };
    Ok([
        "--topology".into(),
        path("topology/local-3-regions.toml")?,
        "--placement".into(),
        path("topology/local-3-regions.placement.toml")?,
    ])
}

/// `pangea sim calibrate` on the local three-region cluster with `args`, killed
/// after `limit`.
fn calibrate(args: &[&str], limit: Duration) -> Result<std::process::Output> {
    let files = local_3_regions()?;
    let all: Vec<&str> = ["sim", "calibrate"]
        .into_iter()
        .chain(files.iter().map(String::as_str))
        .chain(args.iter().copied())
        .collect();
    common::pangea(&all, limit)
}

#[test]
fn calibrate_reports_both_sides_for_every_region_mode_and_pair() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let json = dir.path().join("calibrate.json");
    let data = dir.path().join("cluster");
    let out = calibrate(
        &[
            "--duration",
            "4s",
            "--rate",
            "150",
            // A kill run too: 12 s, the kill 2 s in.
            "--kill",
            "euw1-b",
            "--kill-at",
            "2s",
            "--data-dir",
            data.to_str().context("path")?,
            "--json",
            json.to_str().context("path")?,
        ],
        Duration::from_secs(180),
    )?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "calibrate failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{stdout}");
    ensure!(stdout.contains("READ P99") && stdout.contains("REPLICATION LAG P99"));
    let all: serde_json::Value = serde_json::from_slice(&std::fs::read(&json)?)?;
    let report = &all["levels"][0];
    let reads = report["reads_p99"].as_array().context("reads_p99")?;
    // On a test machine loaded by other work, a live read can cost more than the
    // workload's 20 ms read deadline; the service time fitted to it then times out
    // every read of the fitted simulation, which has no figures to report (that is
    // the fitted model's correct prediction). Its figures are checked otherwise.
    let overhead_us = report["fitted_host"]["overhead_us"]
        .as_u64()
        .context("fitted_host.overhead_us")?;
    let fitted_answers = overhead_us < 20_000;
    let sides: &[&str] = if fitted_answers {
        &["sim_ms", "fitted_ms", "live_ms"]
    } else {
        println!("fitted overhead {overhead_us} µs exceeds the read deadline");
        &["sim_ms", "live_ms"]
    };
    for region in ["us-east-1", "eu-west-1", "ap-northeast-1"] {
        for mode in ["eventual", "affinity", "bounded"] {
            let what = format!("{region} {mode}");
            let row = reads
                .iter()
                .find(|r| r["what"] == what.as_str())
                .with_context(|| format!("no row for {what}"))?;
            ensure!(row["live_count"].as_u64() > Some(0), "{what}: {row}");
            for side in sides {
                ensure!(row[side].as_f64() > Some(0.0), "{what}: no {side}: {row}");
            }
        }
    }
    // Writes from every region replicated to the others, measured on both sides
    // (which serving replica of a region takes a frontend's writes is drawn, so the
    // pairs of a short run vary).
    let lag = report["replication_lag_p99"]
        .as_array()
        .context("replication_lag_p99")?;
    let both: Vec<&str> = lag
        .iter()
        .filter(|r| r["fitted_ms"].as_f64().is_some() && r["live_count"].as_u64() > Some(0))
        .filter_map(|r| r["what"].as_str())
        .collect();
    for prefix in ["use1-", "euw1-", "apne1-"] {
        ensure!(
            both.iter().any(|w| w.starts_with(prefix)),
            "no pair from an origin {prefix}* measured on both sides: {both:?}"
        );
    }
    // Each pair's median beside its p99, no higher on either side.
    let medians = report["replication_lag_p50"]
        .as_array()
        .context("replication_lag_p50")?;
    ensure!(
        medians.len() == lag.len(),
        "{} medians, {} p99s",
        medians.len(),
        lag.len()
    );
    for (m, p) in medians.iter().zip(lag) {
        ensure!(m["what"] == p["what"], "{m} beside {p}");
        for side in ["sim_ms", "live_ms"] {
            if let (Some(m50), Some(p99)) = (m[side].as_f64(), p[side].as_f64()) {
                ensure!(m50 > 0.0 && m50 <= p99, "{side}: median {m} above p99 {p}");
            }
        }
    }
    ensure!(stdout.contains("REPLICATION LAG P50"));
    // Acknowledged writes' latency is kept, p50 ≤ p95 ≤ p99 (a frontend hedges
    // after the p95 of every request it timed, writes included).
    let w = &report["live"]["writes_ms"];
    let (p50, p95, p99) = (w[0].as_f64(), w[1].as_f64(), w[2].as_f64());
    ensure!(
        report["live"]["writes"].as_u64() > Some(0) && p50 > Some(0.0) && p50 <= p95 && p95 <= p99,
        "live writes' latency: {w}"
    );
    // Every read's far tail is kept: p99 ≤ p99.9 ≤ the slowest (what hedges
    // fire on, beyond the p99 the figures compare).
    let pooled = &report["live"]["all_reads"];
    let tail = &report["live"]["all_reads_tail_ms"];
    let (p99, p999, max) = (pooled[2].as_f64(), tail[0].as_f64(), tail[1].as_f64());
    ensure!(
        p99 > Some(0.0) && p99 <= p999 && p999 <= max,
        "live reads' tail: p99 {pooled}, p99.9 and slowest {tail}"
    );
    // The fitted host costs are at least the shipped defaults.
    let shipped = pangea_sim::host::HostModel::default();
    ensure!(report["fitted_host"]["overhead_us"].as_u64() >= Some(shipped.overhead_us));
    ensure!(report["fitted_host"]["commit_us"].as_u64() >= Some(shipped.commit_us as u64));
    // The kill: live, the frontends noticed (errors, hedges or failovers in the
    // 10 s after it) and so did the simulated ones, the killed process silent or
    // refusing; the killed replica's lag is not asked of a dead process.
    let kill = &all["kill"]["kill"];
    ensure!(kill["replica"] == "euw1-b", "{kill}");
    let noticed = |w: &serde_json::Value| {
        ["read_errors", "write_errors", "hedges", "failovers"]
            .iter()
            .filter_map(|k| w[k].as_u64())
            .sum::<u64>()
    };
    for side in ["live", "sim_refused", "sim_silent"] {
        ensure!(kill[side]["reads"].as_u64() > Some(0), "{side}: {kill}");
    }
    ensure!(
        noticed(&kill["live"]) > 0,
        "the live frontends did not notice: {kill}"
    );
    for side in ["sim_refused", "sim_silent"] {
        ensure!(
            noticed(&kill[side]) > 0,
            "{side}: the simulated ones did not: {kill}"
        );
    }
    ensure!(stdout.contains("KILL of euw1-b"));
    // Replayed against the recorded live figures, without a live cluster, the
    // model gives back the same comparison, figure for figure.
    let replayed = dir.path().join("replayed.json");
    let out = common::pangea(
        &[
            "sim",
            "calibrate",
            "--replay",
            json.to_str().context("path")?,
            "--json",
            replayed.to_str().context("path")?,
        ],
        Duration::from_secs(60),
    )?;
    ensure!(
        out.status.success(),
        "replay failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again: serde_json::Value = serde_json::from_slice(&std::fs::read(&replayed)?)?;
    for key in ["fitted_host", "reads_p99", "replication_lag_p99", "live"] {
        ensure!(
            again["levels"][0][key] == all["levels"][0][key],
            "replayed {key} differs"
        );
    }
    ensure!(
        again["kill"]["kill"] == all["kill"]["kill"],
        "replayed kill differs"
    );
    // The live cluster was stopped.
    let cluster = pangea_topology::cluster::ClusterFile::load(&data.join("cluster.toml"))
        .map_err(|e| anyhow::anyhow!(e))?;
    for r in &cluster.replicas {
        ensure!(
            !r.pid.is_some_and(common::alive),
            "replica {} still runs",
            r.id
        );
    }
    Ok(())
}

/// Ctrl-C (SIGINT) or SIGTERM once the live cluster runs stops it: its replicas
/// run in process groups of their own, so nothing else would, and an
/// interrupted calibration must not leave seven replicas serving and loading
/// the machine. The process then exits as the signal would.
#[test]
fn an_interrupted_calibration_stops_its_live_cluster() -> Result<()> {
    use nix::sys::signal::Signal;
    interrupt_calibration(Signal::SIGTERM, 128 + 15)?;
    interrupt_calibration(Signal::SIGINT, 128 + 2)
}

fn interrupt_calibration(signal: nix::sys::signal::Signal, code: i32) -> Result<()> {
    use pangea_topology::cluster::ClusterFile;
    use std::process::{Command, Stdio};
    use std::time::Instant;

    let dir = tempfile::tempdir()?;
    let data = dir.path().join("cluster");
    let mut child = Command::new(common::PANGEA)
        .args(["sim", "calibrate"])
        .args(local_3_regions()?)
        .args(["--duration", "10s", "--rate", "150", "--data-dir"])
        .arg(&data)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    // Until every replica of the live cluster runs: the cluster file lists them
    // once started (after the simulated run, before the live one).
    let cluster_file = pangea_ops::local::cluster_path(&data);
    let started = Instant::now();
    let pids: Vec<u32> = loop {
        if started.elapsed() > Duration::from_secs(180) || child.try_wait()?.is_some() {
            let _ = child.kill();
            let out = child.wait_with_output()?;
            anyhow::bail!(
                "the live cluster did not start within 180 s; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if let Ok(c) = ClusterFile::load(&cluster_file) {
            let pids: Vec<u32> = c.replicas.iter().filter_map(|r| r.pid).collect();
            if pids.len() == c.replicas.len() && pids.iter().all(|p| common::alive(*p)) {
                break pids;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    pangea_ops::local::signal(child.id(), signal);
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            for p in &pids {
                common::sigkill(*p);
            }
            anyhow::bail!("calibrate did not exit within 30 s of {signal}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().context("stderr")?, &mut stderr)?;
    let running: Vec<u32> = pids.iter().copied().filter(|p| common::alive(*p)).collect();
    for p in &running {
        common::sigkill(*p);
    }
    ensure!(
        running.is_empty(),
        "replicas {running:?} still run after calibrate exited on {signal}; stderr:\n{stderr}"
    );
    ensure!(
        status.code() == Some(code),
        "calibrate exited with {status} after {signal}, not as the signal would ({code}); \
         stderr:\n{stderr}"
    );
    ensure!(
        stderr.contains("interrupted: stopping the live cluster"),
        "stderr does not say the cluster was stopped:\n{stderr}"
    );
    Ok(())
}

/// A calibration pointed at a directory where a cluster already runs is refused
/// (`cluster up` will not start a second one there), and its guard leaves that
/// cluster alone: it stops only a cluster its own run started.
#[test]
fn a_calibration_refused_in_a_busy_directory_leaves_its_cluster_running() -> Result<()> {
    let cluster = common::Cluster::up(false)?;
    let out = calibrate(
        &[
            "--duration",
            "2s",
            "--rate",
            "150",
            "--data-dir",
            cluster.dir.path().to_str().context("path")?,
        ],
        Duration::from_secs(180),
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "calibrate ran in a busy directory");
    ensure!(
        stderr.contains("a cluster is already running"),
        "calibrate did not say why it stopped:\n{stderr}"
    );
    let stopped: Vec<String> = cluster
        .ids()
        .into_iter()
        .filter(|id| cluster.pid(id).is_ok_and(|p| !common::alive(p)))
        .collect();
    ensure!(
        stopped.is_empty(),
        "the refused calibration stopped replicas {stopped:?} of the running cluster"
    );
    Ok(())
}
