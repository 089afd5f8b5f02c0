//! Placement with real processes: the residency canary (marker bytes in EU-only rows
//! never reach a non-EU replica's files, any log or any exported trace, even with a
//! non-EU relay on the cheapest path and migrations running), and a migration that
//! survives a SIGKILL of the replica running it.

mod common;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use common::Cluster;
use pangea_client::{Client, ClientConfig, Mutation, ReadOptions, RowMutation, WriteOptions};
use std::path::Path;
use std::time::{Duration, Instant};

fn set(key: &str, value: String) -> Result<RowMutation> {
    let m = Mutation::SetCell {
        family: "profile".into(),
        column: Bytes::from_static(b"p"),
        value: Bytes::from(value),
    };
    Ok(RowMutation::new(
        "ad_profiles",
        key.to_owned(),
        vec![m],
        &pangea_core::Limits::default(),
    )?)
}

async fn write_many(
    client: &Client,
    keys: Vec<String>,
    value: impl Fn(&str) -> String + Clone + Send + 'static,
    lanes: usize,
) -> Result<u64> {
    let mut tasks = tokio::task::JoinSet::new();
    let keys = std::sync::Arc::new(keys);
    for lane in 0..lanes {
        let (client, keys, value) = (client.clone(), keys.clone(), value.clone());
        tasks.spawn(async move {
            let mut n = 0u64;
            for k in keys.iter().skip(lane).step_by(lanes) {
                client
                    .mutate(
                        set(k, value(k))?,
                        &WriteOptions {
                            deadline: Some(Duration::from_secs(5)),
                            ..Default::default()
                        },
                    )
                    .await?;
                n += 1;
            }
            anyhow::Ok(n)
        });
    }
    let mut total = 0;
    while let Some(r) = tasks.join_next().await {
        total += r??;
    }
    Ok(total)
}

/// Every file under `dir` that contains `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Result<Vec<String>> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read(&p)?
                .windows(needle.len())
                .any(|w| w == needle)
            {
                hits.push(p.display().to_string());
            }
        }
    }
    Ok(hits)
}

async fn wait_job(
    client: &Client,
    job: &str,
    limit: Duration,
) -> Result<pangea_proto::v1::MigrationJob> {
    let started = Instant::now();
    let mut last_error = None;
    loop {
        // The job table may be out of reach for a moment while a replica restarts
        // (a read that went to it fails over only once it is marked down): retry.
        match client.jobs().await {
            Ok(jobs) => {
                if let Some(j) = jobs.into_iter().find(|j| j.id == job) {
                    ensure!(j.phase != "failed", "job {job} failed: {}", j.error);
                    if j.phase == "done" {
                        return Ok(j);
                    }
                }
            }
            Err(e) => last_error = Some(e),
        }
        ensure!(
            started.elapsed() < limit,
            "job {job} not done after {limit:?} (last error reading jobs: {last_error:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Rows carrying a unique marker in an EU-only policy, 10,000 writes from a European
/// and an American frontend, while other rows migrate into the EU policy and back
/// out; the topology's cheapest path between the two EU regions runs through a
/// non-EU relay. Afterwards no file in a non-EU replica's data directory, no line of
/// any replica's log and no trace any replica exported over OTLP contains the
/// marker, and the audit reports nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn residency_canary_with_migrations_and_a_non_eu_relay() -> Result<()> {
    // Every replica exports its traces to this stand-in collector.
    let sink = common::OtlpSink::start()?;
    let cluster = Cluster::up_with_env(
        "crates/pangea-cli/tests/data/eu-relay.toml",
        "crates/pangea-cli/tests/data/eu-relay.placement.toml",
        false,
        vec![("OTEL_EXPORTER_OTLP_ENDPOINT".into(), sink.endpoint())],
    )?;
    let eu = Client::connect(ClientConfig::from_cluster(
        &cluster.file,
        "eu-west-1",
        "frontend",
    )?)
    .await?;
    let us = Client::connect(ClientConfig::from_cluster(
        &cluster.file,
        "us-east-1",
        "frontend",
    )?)
    .await?;
    let marker = format!(
        "canary-{:016x}",
        std::process::id() as u64
            ^ 0x5eed_c0de_1234_5678
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_nanos() as u64
    );
    // Rows that will migrate: global first, no marker.
    let movers: Vec<String> = (0..500).map(|i| format!("mv/{i:04}")).collect();
    write_many(&us, movers, |_| "plain".to_owned(), 16).await?;
    let m1 = marker.clone();
    let m2 = marker.clone();
    let eu_writes = write_many(
        &eu,
        (0..6_000).map(|i| format!("eu/{i:05}")).collect(),
        move |k| format!("{m1}-{k}"),
        32,
    );
    let us_writes = write_many(
        &us,
        (6_000..10_000).map(|i| format!("eu/{i:05}")).collect(),
        move |k| format!("{m2}-{k}"),
        32,
    );
    let ops = cluster.operator("eu-west-1").await?;
    let migrations = async {
        let (_, job) = ops
            .placement_move("ad_profiles", b"mv/", "eu-resident", Some("eu-west-1"))
            .await?;
        wait_job(&ops, &job, Duration::from_secs(120)).await?;
        let (_, job) = ops
            .placement_move("ad_profiles", b"mv/", "global", None)
            .await?;
        wait_job(&ops, &job, Duration::from_secs(120)).await?;
        anyhow::Ok(())
    };
    let (a, b, c) = tokio::join!(eu_writes, us_writes, migrations);
    let written = a? + b?;
    c?;
    ensure!(written == 10_000, "{written} writes");
    // Every EU replica has the rows; the American one is refused them.
    let r = us
        .get(
            "ad_profiles",
            Bytes::from_static(b"eu/09999"),
            &ReadOptions::default().with_deadline(Duration::from_secs(1)),
        )
        .await?;
    ensure!(r.region.starts_with("eu-"), "served from {}", r.region);
    for replica in &cluster.file.replicas {
        let a = ops.audit(&replica.id.as_str().into()).await?;
        let bad: u64 = a.tables.iter().map(|t| t.rows_disallowed).sum::<u64>()
            + a.restricted_frames_to_outsiders
            + a.restricted_frames_from_outsiders;
        ensure!(bad == 0, "audit of {}: {a:?}", a.replica);
    }
    drop((eu, us, ops));
    let out = cluster.down(10_000)?;
    ensure!(out.status.success(), "cluster down failed");
    let needle = marker.as_bytes();
    let mut checked = 0;
    for replica in &cluster.file.replicas {
        let files = files_containing(&replica.data_dir, needle)?;
        let log = std::fs::read(replica.log.as_ref().context("log")?)?;
        let in_log = log.windows(needle.len()).any(|w| w == needle);
        if replica.region.starts_with("eu-") {
            // The marker is really there (so the search below can find it).
            ensure!(
                !files.is_empty(),
                "{} has no trace of the EU rows",
                replica.id
            );
        } else {
            ensure!(
                files.is_empty(),
                "non-EU replica {} holds the marker in {files:?}",
                replica.id
            );
            checked += 1;
        }
        ensure!(!in_log, "{}'s log contains a marker", replica.id);
    }
    ensure!(checked == 2, "checked {checked} non-EU replicas");

    // Traces: every replica exported its spans (flushed at the graceful stop), and
    // no exported byte is a marker — values never enter spans, keys only hashed.
    let bodies = sink.bodies();
    let bytes: usize = bodies.iter().map(Vec::len).sum();
    println!("OTLP sink: {} export requests, {bytes} bytes", bodies.len());
    ensure!(sink.malformed() == 0, "the sink could not parse an export");
    let contains = |needle: &[u8]| {
        bodies
            .iter()
            .any(|b| b.windows(needle.len()).any(|w| w == needle))
    };
    for replica in &cluster.file.replicas {
        ensure!(
            contains(replica.id.as_bytes()),
            "no exported trace names replica {} (did it export at all?)",
            replica.id
        );
    }
    ensure!(contains(b"pangea.serve"), "no request span was exported");
    ensure!(!contains(needle), "an exported trace contains a marker");
    Ok(())
}

/// A migration whose runner is SIGKILLed in the middle of the backfill resumes from
/// its checkpoint when the replica restarts, and finishes with every row in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_resumes_after_sigkill_of_its_runner() -> Result<()> {
    let mut cluster = Cluster::up(false)?;
    let client = Client::connect(ClientConfig::from_cluster(
        &cluster.file,
        "eu-west-1",
        "frontend",
    )?)
    .await?;
    let keys: Vec<String> = (0..4_000).map(|i| format!("mv/{i:05}")).collect();
    write_many(&client, keys, |k| format!("v-{k}"), 32).await?;
    let ops = cluster.operator("eu-west-1").await?;
    let (runner, job) = ops
        .placement_move("ad_profiles", b"mv/", "eu-resident", Some("eu-west-1"))
        .await?;
    // Kill the runner once the backfill has made progress.
    let started = Instant::now();
    loop {
        let j = ops.jobs().await?.into_iter().find(|j| j.id == job);
        if j.as_ref().is_some_and(|j| {
            j.phase == "backfill" && j.rows_copied > 0 || j.phase == "flip" || j.phase == "done"
        }) {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(30),
            "backfill never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.kill9(runner.as_str())?;
    let killed_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.restart(runner.as_str())?;
    let j = wait_job(&ops, &job, Duration::from_secs(90)).await?;
    eprintln!(
        "job resumed after SIGKILL of {runner}; done {:.1} s after the kill, {} rows copied",
        killed_at.elapsed().as_secs_f64(),
        j.rows_copied
    );
    ensure!(j.rows_copied >= 4_000, "{} rows copied", j.rows_copied);
    for k in ["mv/00000", "mv/01999", "mv/03999"] {
        let r = client
            .get(
                "ad_profiles",
                Bytes::from(k),
                &ReadOptions::default().with_deadline(Duration::from_secs(1)),
            )
            .await?;
        ensure!(
            r.value.is_some() && r.region == "eu-west-1",
            "{k}: {:?} from {}",
            r.value.is_some(),
            r.region
        );
    }
    for replica in &cluster.file.replicas {
        let a = ops.audit(&replica.id.as_str().into()).await?;
        let disallowed: u64 = a.tables.iter().map(|t| t.rows_disallowed).sum();
        ensure!(
            disallowed == 0,
            "{} holds rows its placement forbids",
            a.replica
        );
    }
    Ok(())
}
