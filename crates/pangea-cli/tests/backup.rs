//! Backups and point-in-time restore on a live local cluster (issue 38 points
//! 2 and 3; docs/operations.md "Back up and restore", "Recover from a bad
//! batch job"): rows are written, backed up while a frontend keeps writing and
//! reading (the global policy from the US, the EU-resident one from the EU),
//! changed by good writes (some in an incremental backup, some only in the
//! change log), then corrupted by a "bad batch job" (garbage values, new rows,
//! deletes, counter increments). `pangea backup restore --as-of` a time before
//! the job brings every row back to its value at that time. A damaged backup
//! file is refused by name before anything is written.

mod common;

use anyhow::{Context, Result, ensure};
use common::{Cluster, EU, US, cell_value, profile_set, setup_writes};
use pangea_client::{Client, Mutation, ReadOptions, RowMutation};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const TABLE: &str = "ad_profiles";
/// Global rows, EU-resident rows, rows with a counter.
const ROWS: usize = 120;
const EU_ROWS: usize = 30;
const COUNTERS: usize = 10;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn pangea(args: &[&str]) -> Result<String> {
    let out = common::pangea(args, Duration::from_secs(120))?;
    ensure!(
        out.status.success(),
        "pangea {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn put(client: &Client, key: &str, value: &str) -> Result<()> {
    client
        .mutate(profile_set(key, value.to_owned())?, &setup_writes())
        .await
        .with_context(|| format!("writing {key}"))?;
    Ok(())
}

async fn incr(client: &Client, key: &str, delta: i64) -> Result<()> {
    let m = RowMutation::new(
        TABLE,
        key.to_owned(),
        vec![Mutation::Increment {
            family: "impressions".into(),
            column: bytes::Bytes::from_static(b"c1"),
            delta,
        }],
        &Default::default(),
    )?;
    client.mutate(m, &setup_writes()).await?;
    Ok(())
}

/// The row's `profile:p` and `impressions:c1` as a reader in `client`'s region sees them.
async fn read(client: &Client, key: &str) -> Result<(Option<String>, Option<i64>)> {
    let opts = ReadOptions::default().with_deadline(Duration::from_secs(5));
    let row = client.get(TABLE, key.to_owned(), &opts).await?.value;
    Ok(match row {
        None => (None, None),
        Some(r) => (
            cell_value(&r, "profile", b"p").map(|v| String::from_utf8_lossy(v).into_owned()),
            cell_value(&r, "impressions", b"c1")
                .map(|v| i64::from_be_bytes(v.try_into().unwrap_or([0; 8]))),
        ),
    })
}

#[test]
fn a_bad_batch_job_is_undone_by_a_restore_as_of_before_it() -> Result<()> {
    let c = Cluster::up(false)?;
    let cluster = c.cluster_path();
    let cluster = cluster.to_str().context("path")?;
    let dir = tempfile::tempdir()?;
    let at = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let rt = common::runtime()?;
    let us = rt.block_on(c.client(US, "frontend"))?;
    let eu = rt.block_on(c.client(EU, "frontend"))?;
    // What each row holds, as the test wrote it: value and counter.
    let mut expected: BTreeMap<String, (Option<String>, Option<i64>)> = BTreeMap::new();
    rt.block_on(async {
        for i in 0..ROWS {
            let key = format!("bk/{i:04}");
            put(&us, &key, &format!("v1-{i}")).await?;
            expected.insert(key, (Some(format!("v1-{i}")), None));
        }
        for i in 0..COUNTERS {
            let key = format!("bk/{i:04}");
            incr(&us, &key, 3).await?;
            incr(&us, &key, 4).await?;
            expected.get_mut(&key).expect("written").1 = Some(7);
        }
        for i in 0..EU_ROWS {
            let key = format!("eu/bk-{i:04}");
            put(&eu, &key, &format!("e1-{i}")).await?;
            expected.insert(key, (Some(format!("e1-{i}")), None));
        }
        Ok::<_, anyhow::Error>(())
    })?;

    // A frontend keeps writing (rows of its own) and reading while the
    // backups run: serving does not stop.
    let stop = Arc::new(AtomicBool::new(false));
    let (served, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let frontend = rt.spawn({
        let (us, stop, served, failed) = (us.clone(), stop.clone(), served.clone(), failed.clone());
        async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("bk-live/{:04}", i % 500);
                let ok = put(&us, &key, &format!("live-{i}")).await.is_ok()
                    && read(&us, &key).await.is_ok();
                if ok { &served } else { &failed }.fetch_add(1, Ordering::Relaxed);
                i += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    });
    let full = at("full");
    let shown = pangea(&[
        "backup",
        "create",
        "--cluster",
        cluster,
        "--region",
        US,
        "--to",
        &full,
    ])?;
    let eu_full = at("eu-full");
    pangea(&[
        "backup",
        "create",
        "--cluster",
        cluster,
        "--region",
        EU,
        "--policies",
        "eu-resident",
        "--to",
        &eu_full,
    ])?;
    stop.store(true, Ordering::Relaxed);
    rt.block_on(frontend)?;
    ensure!(
        served.load(Ordering::Relaxed) > 0 && failed.load(Ordering::Relaxed) == 0,
        "frontend during the backups: {} served, {} failed",
        served.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );

    // Residency: the US backup left the EU-resident policy out and says where
    // to take it; the EU backup holds only it, to be stored in the EU.
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        Path::new(&full).join("manifest.json"),
    )?)?;
    let scopes: Vec<&str> = m["scopes"]
        .as_array()
        .context("scopes")?
        .iter()
        .filter_map(|s| s["scope"].as_str())
        .collect();
    ensure!(scopes == ["global"], "US backup scopes {scopes:?}\n{shown}");
    ensure!(
        m["skipped"].to_string().contains("eu-resident"),
        "US backup: {}",
        m["skipped"]
    );
    ensure!(
        m["scopes"][0]["exact"] == true,
        "the global scope's backup is not exact: {}",
        m["scopes"][0]["note"]
    );
    let e: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        Path::new(&eu_full).join("manifest.json"),
    )?)?;
    ensure!(
        e["scopes"].as_array().map(|s| s.len()) == Some(1)
            && e["scopes"][0]["scope"] == "eu-resident"
            && e["scopes"][0]["regions"] == serde_json::json!(["eu-west-1"])
            && e["scopes"][0]["replica"]
                .as_str()
                .is_some_and(|r| r.starts_with("euw1")),
        "EU backup: {}",
        e["scopes"]
    );
    pangea(&["backup", "verify", &full])?;

    // Good writes after the backup: the first half before an incremental
    // backup, the second half only in the change log.
    type Expected = BTreeMap<String, (Option<String>, Option<i64>)>;
    let good = |from: usize, to: usize, expected: &mut Expected| {
        rt.block_on(async {
            for i in from..to {
                let key = format!("bk/{i:04}");
                put(&us, &key, &format!("v2-{i}")).await?;
                expected.entry(key).or_default().0 = Some(format!("v2-{i}"));
            }
            let key = format!("eu/bk-{from:04}");
            put(&eu, &key, "e2").await?;
            expected.entry(key).or_default().0 = Some("e2".into());
            let key = format!("bk/{from:04}");
            incr(&us, &key, 10).await?;
            let e = expected.entry(key).or_default();
            e.1 = Some(e.1.unwrap_or(0) + 10);
            Ok::<_, anyhow::Error>(())
        })
    };
    good(0, 20, &mut expected)?;
    let incremental = at("incremental");
    pangea(&[
        "backup",
        "create",
        "--cluster",
        cluster,
        "--region",
        US,
        "--incremental-from",
        &full,
        "--to",
        &incremental,
    ])?;
    good(20, 40, &mut expected)?;
    // New rows, made before the job: they must come back too.
    rt.block_on(async {
        for i in 0..5 {
            let key = format!("bk/new-{i}");
            put(&us, &key, "n1").await?;
            expected.insert(key, (Some("n1".into()), None));
        }
        Ok::<_, anyhow::Error>(())
    })?;
    std::thread::sleep(Duration::from_millis(1_200));
    let before_job = now_ms();
    std::thread::sleep(Duration::from_millis(1_200));

    // The bad batch job: garbage in every row, new rows, deleted rows, counts.
    rt.block_on(async {
        for key in expected.keys() {
            let client = if key.starts_with("eu/") { &eu } else { &us };
            put(client, key, "GARBAGE").await?;
        }
        for i in 0..10 {
            put(&us, &format!("bk/junk-{i}"), "GARBAGE").await?;
        }
        for i in 50..60 {
            us.mutate(
                RowMutation::new(
                    TABLE,
                    format!("bk/{i:04}"),
                    vec![Mutation::DeleteFromRow],
                    &Default::default(),
                )?,
                &setup_writes(),
            )
            .await?;
        }
        for i in 0..COUNTERS {
            incr(&us, &format!("bk/{i:04}"), 1_000).await?;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    ensure!(rt.block_on(read(&us, "bk/0001"))?.0.as_deref() == Some("GARBAGE"));

    // A damaged copy is refused, naming the file, before anything is written.
    let damaged = at("damaged");
    copy_dir(Path::new(&full), Path::new(&damaged))?;
    let rows = Path::new(&damaged).join("global/global/ad_profiles.rows");
    let mut bytes = std::fs::read(&rows)?;
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x20;
    std::fs::write(&rows, bytes)?;
    for args in [
        vec!["backup", "verify", &damaged],
        vec![
            "backup",
            "restore",
            "--cluster",
            cluster,
            "--region",
            US,
            "--from",
            &damaged,
            "--mode",
            "replace",
        ],
    ] {
        let out = common::pangea(&args, Duration::from_secs(60))?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains("ad_profiles.rows") && err.contains("damaged"),
            "{args:?} on a damaged backup: {err}"
        );
    }
    ensure!(rt.block_on(read(&us, "bk/0001"))?.0.as_deref() == Some("GARBAGE"));

    // The restore, as of before the job: the full backup, the incremental,
    // the log after it; the EU rows from the EU's backup.
    let as_of = before_job.to_string();
    let report = pangea(&[
        "backup",
        "restore",
        "--cluster",
        cluster,
        "--region",
        US,
        "--from",
        &incremental,
        "--from",
        &eu_full,
        "--as-of",
        &as_of,
        "--mode",
        "replace",
        "--json",
    ])?;
    let mut wrong = Vec::new();
    rt.block_on(async {
        // Replication: give every region a moment, then read from each.
        for client in [&us, &eu] {
            for (key, want) in &expected {
                let got = common::eventually(
                    Duration::from_secs(10),
                    Duration::from_millis(50),
                    key,
                    || async {
                        let got = read(client, key).await?;
                        Ok((got == *want).then_some(got))
                    },
                )
                .await;
                if got.is_err() {
                    wrong.push((key.clone(), read(client, key).await?, want.clone()));
                }
            }
        }
        for i in 0..10 {
            let key = format!("bk/junk-{i}");
            let got = read(&us, &key).await?;
            if got != (None, None) {
                wrong.push((key, got, (None, None)));
            }
        }
        Ok::<_, anyhow::Error>(())
    })?;
    ensure!(
        wrong.is_empty(),
        "{} rows differ from their value before the job (key, got, wanted): {:?}\nrestore: {report}",
        wrong.len(),
        &wrong[..wrong.len().min(8)]
    );
    println!("every row as of {as_of} again; restore reports: {report}");
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let target = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &target)?;
        } else {
            std::fs::copy(e.path(), target)?;
        }
    }
    Ok(())
}

/// A restore into a new cluster (`--mode merge`): every row comes back with its
/// versions, counters with their sums; restored again after a newer write, the
/// newer version wins. Two single-replica clusters of one topology (a merged
/// version must name a replica of the topology), the source without a change
/// stream: its backup says it is not exact, and why.
#[test]
fn a_backup_restored_into_a_new_cluster_merges_and_newer_versions_win() -> Result<()> {
    const TOPOLOGY: &str = "topology/single-replica.toml";
    const PLACEMENT: &str = "topology/single-replica.placement.toml";
    const REGION: &str = "local-1";
    let source = Cluster::up_with(TOPOLOGY, PLACEMENT, false)?;
    let target = Cluster::up_with(TOPOLOGY, PLACEMENT, false)?;
    let dir = tempfile::tempdir()?;
    let to = dir.path().join("full").to_string_lossy().into_owned();
    let rt = common::runtime()?;
    let (src, dst) = rt.block_on(async {
        Ok::<_, anyhow::Error>((
            source.client(REGION, "frontend").await?,
            target.client(REGION, "frontend").await?,
        ))
    })?;
    let mut expected = BTreeMap::new();
    rt.block_on(async {
        for i in 0..200 {
            let key = format!("m/{i:04}");
            put(&src, &key, &format!("v-{i}")).await?;
            let mut count = None;
            if i % 10 == 0 {
                incr(&src, &key, i as i64 + 1).await?;
                count = Some(i as i64 + 1);
            }
            expected.insert(key, (Some(format!("v-{i}")), count));
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let source_file = source.cluster_path();
    let target_file = target.cluster_path();
    pangea(&[
        "backup",
        "create",
        "--cluster",
        source_file.to_str().context("path")?,
        "--region",
        REGION,
        "--to",
        &to,
    ])?;
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        Path::new(&to).join("manifest.json"),
    )?)?;
    ensure!(
        m["scopes"][0]["exact"] == false
            && m["scopes"][0]["note"]
                .as_str()
                .is_some_and(|n| n.contains("no change stream")),
        "a backup without tails must say so: {}",
        m["scopes"][0]
    );
    let restore = || {
        pangea(&[
            "backup",
            "restore",
            "--cluster",
            target_file.to_str().context("path")?,
            "--region",
            REGION,
            "--from",
            &to,
        ])
    };
    restore()?;
    rt.block_on(async {
        for (key, want) in &expected {
            let got = read(&dst, key).await?;
            ensure!(got == *want, "{key}: {got:?}, backed up {want:?}");
        }
        // The restored version is the written one, not the restore's.
        let opts = ReadOptions::default().with_deadline(Duration::from_secs(5));
        let (a, b) = (
            src.get(TABLE, "m/0007", &opts)
                .await?
                .value
                .context("source row")?,
            dst.get(TABLE, "m/0007", &opts)
                .await?
                .value
                .context("restored row")?,
        );
        ensure!(a.families == b.families, "versions differ: {a:?} vs {b:?}");
        // Newer versions win over a merge.
        put(&dst, "m/0003", "newer").await?;
        Ok::<_, anyhow::Error>(())
    })?;
    restore()?;
    rt.block_on(async {
        ensure!(read(&dst, "m/0003").await?.0.as_deref() == Some("newer"));
        // Counters are not counted twice by a second merge of the same backup.
        ensure!(read(&dst, "m/0010").await?.1 == Some(11));
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(())
}
