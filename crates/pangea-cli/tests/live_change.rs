//! Live changes on real processes: `pangea topology apply` adds a replica (it
//! bootstraps from a neighbour and serves), removes another (it stops once the others
//! let it go), and applies a placement rule change (a migration job moves the rows),
//! while a frontend keeps reading: failed reads = 0 throughout. The running
//! frontends follow the new files without a restart (replicas announce their
//! files' digest, the client fetches them): the added replica answers their reads
//! within 5 s, and they stop asking the removed one. An invalid file changes
//! nothing.

mod common;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use common::{Cluster, EU, alive, call, cell_value, eventually, get_request, pangea, request};
use pangea_client::{Client, Consistency, Mutation, ReadOptions, RowMutation, WriteOptions};
use pangea_proto::v1 as pb;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const ROWS: usize = 200;
const APPLY_TIME_MAX: Duration = Duration::from_secs(60);

fn key(i: usize) -> String {
    format!("us/{i:04}")
}

async fn write_rows(client: &Client) -> Result<()> {
    for i in 0..ROWS {
        let m = Mutation::SetCell {
            family: "profile".into(),
            column: Bytes::from_static(b"p"),
            value: Bytes::from(format!("value-{i}")),
        };
        let row = RowMutation::new("ad_profiles", key(i), vec![m], &Default::default())?;
        client
            .mutate(
                row,
                &WriteOptions {
                    deadline: Some(Duration::from_secs(5)),
                    ..Default::default()
                },
            )
            .await?;
    }
    Ok(())
}

/// Reads every row in turn until told to stop; counts reads and failures (an error,
/// or a missing or wrong value) and keeps the first few failures for the report.
struct Reader {
    stop: Arc<AtomicBool>,
    reads: Arc<AtomicU64>,
    failures: Arc<std::sync::Mutex<Vec<String>>>,
    /// When each replica last answered.
    answered: Arc<std::sync::Mutex<BTreeMap<String, Instant>>>,
    client: Client,
    task: tokio::task::JoinHandle<()>,
}

impl Reader {
    fn start(client: Client, consistency: Consistency) -> Reader {
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
        let answered = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
        let (s, r, f, a) = (
            stop.clone(),
            reads.clone(),
            failures.clone(),
            answered.clone(),
        );
        let reading = client.clone();
        let task = tokio::spawn(async move {
            let client = reading;
            let options = ReadOptions::default()
                .with_consistency(consistency)
                .with_deadline(Duration::from_secs(2));
            let mut i = 0;
            while !s.load(Ordering::Relaxed) {
                let k = key(i % ROWS);
                let want = format!("value-{}", i % ROWS);
                let outcome = client
                    .get("ad_profiles", Bytes::from(k.clone()), &options)
                    .await;
                let failure = match outcome {
                    Err(e) => Some(format!("{k}: {e}")),
                    Ok(resp) => {
                        if let Ok(mut a) = a.lock() {
                            a.insert(resp.replica.to_string(), Instant::now());
                        }
                        let got = resp
                            .value
                            .as_ref()
                            .and_then(|row| cell_value(row, "profile", b"p"));
                        (got != Some(want.as_bytes()))
                            .then(|| format!("{k}: {got:?} from {}", resp.replica))
                    }
                };
                r.fetch_add(1, Ordering::Relaxed);
                if let Some(failure) = failure
                    && let Ok(mut f) = f.lock()
                {
                    f.push(failure);
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        Reader {
            stop,
            reads,
            failures,
            answered,
            client,
            task,
        }
    }

    /// When `replica` last answered one of its reads.
    fn answered_at(&self, replica: &str) -> Option<Instant> {
        self.answered.lock().ok()?.get(replica).copied()
    }

    async fn finish(self) -> Result<(u64, Vec<String>)> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?;
        let failures = self.failures.lock().map(|f| f.clone()).unwrap_or_default();
        Ok((self.reads.load(Ordering::Relaxed), failures))
    }
}

fn apply(cluster: &Cluster, topology: &Path, placement: Option<&Path>) -> Result<String> {
    let cluster_file = cluster.cluster_path();
    let mut args = vec![
        "topology",
        "apply",
        "--cluster",
        cluster_file.to_str().context("path")?,
        topology.to_str().context("path")?,
    ];
    if let Some(p) = placement {
        args.extend(["--placement", p.to_str().context("path")?]);
    }
    let out = pangea(&args, APPLY_TIME_MAX)?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "topology apply failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// Replica `id` answers a read of `key(ROWS - 1)` with the right value.
async fn serves_last_row(cluster: &Cluster, id: &str) -> Result<Option<()>> {
    let raw = cluster.raw_client("frontend")?;
    let conn = raw.connect(cluster.addr(id)?, id).await?;
    let k = key(ROWS - 1);
    let resp = call(
        &conn,
        &request(
            "frontend",
            2_000_000,
            get_request("ad_profiles", k.as_bytes(), None),
        ),
    )
    .await?;
    let want = format!("value-{}", ROWS - 1);
    Ok(match resp.response {
        Some(pb::client_response::Response::Get(g))
            if g.row
                .as_ref()
                .and_then(|row| cell_value(row, "profile", b"p"))
                == Some(want.as_bytes()) =>
        {
            Some(())
        }
        _ => None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_and_remove_replicas_and_change_placement_with_no_failed_reads() -> Result<()> {
    let mut cluster = Cluster::up(false)?;
    let writer = cluster.client("us-east-1", "frontend").await?;
    write_rows(&writer).await?;
    let reader = Reader::start(cluster.client(EU, "frontend").await?, Consistency::Eventual);
    // Row affinity spreads the rows over the region's serving replicas: a third
    // of them move to a replica the region gains.
    let affine = Reader::start(
        cluster.client(EU, "frontend").await?,
        Consistency::RowAffinity,
    );
    let work = tempfile::tempdir()?;
    let original = std::fs::read_to_string(common::repo_file("topology/local-3-regions.toml"))?;
    let euw1_b = "    id = \"euw1-b\"\n    role = \"serving\"\n    zone = \"eu-west-1b\"\n";
    ensure!(original.contains(euw1_b), "topology layout changed");

    // An invalid file changes nothing and says why.
    let broken = work.path().join("broken.toml");
    std::fs::write(
        &broken,
        original.replace("id = \"euw1-b\"", "id = \"use1-a\""),
    )?;
    let out = pangea(
        &[
            "topology",
            "apply",
            "--cluster",
            cluster.cluster_path().to_str().context("path")?,
            broken.to_str().context("path")?,
        ],
        APPLY_TIME_MAX,
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "a duplicate replica id was applied");
    ensure!(
        stderr.contains("nothing changed") && stderr.contains("use1-a"),
        "unclear refusal: {stderr}"
    );

    // Add euw1-c: it bootstraps from a neighbour and serves every row.
    let added = work.path().join("added.toml");
    let euw1_c = "\n    [[continents.regions.replicas]]\n    id = \"euw1-c\"\n    role = \"serving\"\n    zone = \"eu-west-1c\"\n";
    let with_c = original.replace(euw1_b, &format!("{euw1_b}{euw1_c}"));
    std::fs::write(&added, &with_c)?;
    let out = apply(&cluster, &added, None)?;
    ensure!(
        out.contains("euw1-c"),
        "the diff does not name euw1-c: {out}"
    );
    cluster.reload()?;
    // The frontends, started before, follow: euw1-c answers their reads within
    // 5 s of `apply` returning.
    let applied = Instant::now();
    eventually(
        Duration::from_secs(5),
        Duration::from_millis(20),
        "a running frontend reads from the added euw1-c",
        || async { Ok(affine.answered_at("euw1-c").filter(|t| *t > applied)) },
    )
    .await?;
    ensure!(
        reader
            .client
            .deployment()
            .topology
            .replicas
            .contains_key("euw1-c"),
        "the eventual reader did not follow the new files"
    );
    // The cluster file records the new process, so `cluster down` stops it.
    ensure!(
        common::alive(cluster.pid("euw1-c")?),
        "the cluster file has no live pid for euw1-c"
    );
    // `apply` returned once euw1-c reported healthy, which it does only after
    // catching up: from then on it serves every row written before it joined.
    ensure!(
        serves_last_row(&cluster, "euw1-c").await?.is_some(),
        "euw1-c reported healthy before it had the rows written before it joined"
    );

    // Remove euw1-b: the others let it go, and it stops.
    let gone_pid = cluster.pid("euw1-b")?;
    let removed = work.path().join("removed.toml");
    let without_b = with_c.replace(
        &format!("    [[continents.regions.replicas]]\n{euw1_b}"),
        "",
    );
    std::fs::write(&removed, without_b)?;
    let out = apply(&cluster, &removed, None);
    let stopped = eventually(
        Duration::from_secs(15),
        Duration::from_millis(50),
        "the removed replica stops",
        || async { Ok((!alive(gone_pid)).then_some(())) },
    )
    .await;
    if stopped.is_err() {
        common::sigkill(gone_pid);
    }
    let out = out?;
    stopped?;
    ensure!(
        out.contains("euw1-b"),
        "the diff does not name euw1-b: {out}"
    );
    cluster.reload()?;
    ensure!(
        cluster.replica("euw1-b").is_err(),
        "euw1-b is still in the cluster file"
    );
    // Both frontends route by files without euw1-b within 5 s (the reads'
    // failures, checked at the end, are none).
    eventually(
        Duration::from_secs(5),
        Duration::from_millis(20),
        "the frontends drop the removed euw1-b",
        || async {
            let gone = [&reader, &affine].iter().all(|r| {
                !r.client
                    .deployment()
                    .topology
                    .replicas
                    .contains_key("euw1-b")
            });
            Ok(gone.then_some(()))
        },
    )
    .await?;
    // The others dropped its gauges (a stale "suspected" would keep an alert firing);
    // counters of what was sent to it stay, as counters do.
    eventually(
        Duration::from_secs(10),
        Duration::from_millis(100),
        "euw1-a drops the gauges of the removed euw1-b",
        || async {
            let (_, metrics) = cluster.admin_get("euw1-a", "/metrics")?;
            let stale = metrics.lines().any(|l| {
                (l.starts_with("pangea_peer_suspected{") || l.starts_with("pangea_inflight_bytes{"))
                    && l.contains("peer=\"euw1-b\"")
            });
            Ok((!stale).then_some(()))
        },
    )
    .await?;

    // A placement rule change: rows under us/ become EU-resident. A migration job
    // moves them; reads keep succeeding.
    let placement = work.path().join("placement.toml");
    // The home of us/ moves with it: a home outside the row's policy is refused.
    let rules =
        std::fs::read_to_string(common::repo_file("topology/local-3-regions.placement.toml"))?
            .replace(
                "prefix = \"us/\"\nhome = \"us-east-1\"",
                "prefix = \"us/\"\nhome = \"eu-west-1\"",
            );
    ensure!(
        rules.matches("home = \"eu-west-1\"").count() == 2,
        "the home rule of us/ was not found in the placement file"
    );
    std::fs::write(
        &placement,
        format!(
            "{rules}\n[[rules]]\ntable = \"ad_profiles\"\nprefix = \"us/\"\npolicy = \"eu-resident\"\n"
        ),
    )?;
    let out = apply(&cluster, &removed, Some(&placement))?;
    ensure!(
        out.contains("us/"),
        "the diff does not name the rule: {out}"
    );
    cluster.reload()?;
    // A frontend that starts now reads the location metadata once, whole; the
    // migration's entries (migrating, then the flip) reach it as changes.
    let watcher = cluster.client(EU, "frontend").await?;
    let admin = cluster.operator(EU).await?;
    let job = eventually(
        Duration::from_secs(60),
        Duration::from_millis(200),
        "a migration job of us/ to eu-resident finishes",
        || async {
            let jobs = admin.jobs().await?;
            let job = jobs
                .into_iter()
                .find(|j| j.prefix.as_ref() == b"us/" && j.to_policy == "eu-resident");
            if let Some(j) = &job {
                ensure!(j.phase != "failed", "migration failed: {}", j.error);
            }
            Ok(job.filter(|j| j.phase == "done"))
        },
    )
    .await?;
    ensure!(
        job.rows_copied >= ROWS as u64,
        "only {} rows copied",
        job.rows_copied
    );
    let moved = eventually(
        Duration::from_secs(5),
        Duration::from_millis(100),
        "the watcher's background refresh learns the flip",
        || async {
            let l = watcher.location();
            Ok(l.lookup("ad_profiles", key(0).as_bytes())
                .filter(|e| e.policy.as_str() == "eu-resident" && e.migrating_to.is_none())
                .map(|_| ()))
        },
    )
    .await;
    let (resets, updates) = (
        watcher.stats().location_resets.load(Ordering::Relaxed),
        watcher.stats().location_updates.load(Ordering::Relaxed),
    );
    eprintln!(
        "watcher: {resets} whole reads of the location metadata, {updates} entries as changes"
    );
    moved?;
    ensure!(
        updates >= 1,
        "the migration's entries did not arrive as changes ({resets} whole reads)"
    );
    let frontend = cluster.client(EU, "frontend").await?;
    frontend.refresh_location().await?;
    let resp = frontend
        .get(
            "ad_profiles",
            Bytes::from(key(0)),
            &ReadOptions::default().with_deadline(Duration::from_secs(2)),
        )
        .await?;
    ensure!(
        resp.region == EU,
        "a moved row was served from {}",
        resp.region
    );

    let (affine_reads, affine_failures) = affine.finish().await?;
    ensure!(
        affine_failures.is_empty(),
        "{} of {affine_reads} affinity reads failed, first: {:?}",
        affine_failures.len(),
        &affine_failures[..affine_failures.len().min(5)]
    );
    let (reads, failures) = reader.finish().await?;
    eprintln!(
        "live changes: {reads} eventual and {affine_reads} affinity reads, {} failed",
        failures.len()
    );
    // Reads ran throughout (a loaded CI machine manages a few hundred).
    ensure!(reads >= 100, "only {reads} reads ran during the changes");
    ensure!(
        failures.is_empty(),
        "{} of {reads} reads failed, first: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    Ok(())
}

/// Removing a replica while it takes writes loses none of them: `apply` first
/// marks it draining (it refuses writes, routes leave it out) and waits until
/// its stream has reached every peer, and only then drops it. Removed at once,
/// its last acknowledged writes were refused by peers that no longer counted it
/// as a member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_replica_under_write_load_loses_no_acknowledged_write() -> Result<()> {
    let mut cluster = Cluster::up(false)?;
    let writer = Arc::new(cluster.client(EU, "frontend").await?);
    let stop = Arc::new(AtomicBool::new(false));
    // Affinity writes: about half of the rows land on euw1-b.
    let task = {
        let (writer, stop) = (writer.clone(), stop.clone());
        tokio::spawn(async move {
            let mut acked: Vec<(String, String, String)> = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let (key, value) = (format!("rm/{i:05}"), format!("v{i}"));
                i += 1;
                let m = Mutation::SetCell {
                    family: "profile".into(),
                    column: Bytes::from_static(b"p"),
                    value: Bytes::from(value.clone()),
                };
                let Ok(row) =
                    RowMutation::new("ad_profiles", key.clone(), vec![m], &Default::default())
                else {
                    continue;
                };
                let opts = WriteOptions {
                    deadline: Some(Duration::from_secs(2)),
                    row_affinity: Some(true),
                    ..Default::default()
                };
                if let Ok(r) = writer.mutate(row, &opts).await {
                    acked.push((key, value, r.replica.to_string()));
                }
            }
            acked
        })
    };
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let work = tempfile::tempdir()?;
    let original = std::fs::read_to_string(common::repo_file("topology/local-3-regions.toml"))?;
    let euw1_b = "    [[continents.regions.replicas]]\n    id = \"euw1-b\"\n    role = \"serving\"\n    zone = \"eu-west-1b\"\n";
    ensure!(original.contains(euw1_b), "topology layout changed");
    let removed = work.path().join("removed.toml");
    std::fs::write(&removed, original.replace(euw1_b, ""))?;
    let gone_pid = cluster.pid("euw1-b")?;
    let out = {
        let cluster_path = cluster.cluster_path();
        tokio::task::spawn_blocking(move || {
            let out = pangea(
                &[
                    "topology",
                    "apply",
                    "--cluster",
                    cluster_path.to_str().unwrap_or_default(),
                    removed.to_str().unwrap_or_default(),
                ],
                APPLY_TIME_MAX,
            )?;
            ensure!(
                out.status.success(),
                "topology apply failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        })
        .await?
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let acked = task.await?;
    if alive(gone_pid) {
        common::sigkill(gone_pid);
    }
    let out = out?;
    ensure!(out.contains("draining euw1-b"), "{out}");
    cluster.reload()?;
    let at_b = acked.iter().filter(|(_, _, r)| r == "euw1-b").count();
    ensure!(
        at_b > 10,
        "only {at_b} of {} acknowledged writes were taken by euw1-b",
        acked.len()
    );
    // Every acknowledged write is in the other regions.
    let reader = cluster.client("us-east-1", "frontend").await?;
    for chunk in acked.chunks(200) {
        let keys: Vec<Bytes> = chunk
            .iter()
            .map(|(k, _, _)| Bytes::from(k.clone()))
            .collect();
        eventually(
            Duration::from_secs(10),
            Duration::from_millis(100),
            "every acknowledged write is read back in us-east-1",
            || async {
                let opts = ReadOptions {
                    deadline: Duration::from_secs(2),
                    ..Default::default()
                };
                let rows = reader.get_many("ad_profiles", &keys, &opts).await?.value;
                let missing: Vec<&str> = chunk
                    .iter()
                    .zip(&rows)
                    .filter(|((_, v, _), row)| {
                        cell_value(row, "profile", b"p") != Some(v.as_bytes())
                    })
                    .map(|((k, _, _), _)| k.as_str())
                    .collect();
                Ok(missing.is_empty().then_some(()))
            },
        )
        .await?;
    }
    Ok(())
}
