//! Rows spread over shard groups on live replicas (docs/sharding.md): with
//! `shard_groups = 8`, each write's token names its row's group scope, the
//! other region applies every group's stream (watermark reads with those
//! tokens are served there), and get-many and scans whose rows span groups are
//! answered whole under bounded staleness, each group's watermarks checked —
//! with each replica one process hosting every group, and with replicas of 3
//! and 2 processes each hosting a range of them (rows stored only by the
//! process hosting their group, get-many split and scans merged by the client).

mod common;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use common::{Cluster, cell_value};
use pangea_client::{Consistency, Mutation, ReadOptions, RowMutation, ScanOptions, WriteOptions};
use pangea_topology::shard::group_of;
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::time::timeout;

const PROFILES: usize = 64;
const USERS: usize = 4;
const EVENTS: usize = 8;

fn set(table: &str, key: String, value: String) -> Result<RowMutation> {
    Ok(RowMutation::new(
        table.to_owned(),
        key,
        vec![Mutation::SetCell {
            family: "profile".into(),
            column: Bytes::from_static(b"p"),
            value: Bytes::from(value),
        }],
        &pangea_core::Limits::default(),
    )?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_many_shard_groups_replicate_and_read_back_whole() -> Result<()> {
    let cluster = Cluster::up_with(
        "crates/pangea-cli/tests/data/sharded.toml",
        "crates/pangea-cli/tests/data/sharded.placement.toml",
        false,
    )?;
    write_and_read_back(&cluster).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_of_many_processes_each_hold_their_groups_rows() -> Result<()> {
    let cluster = Cluster::up_with(
        "crates/pangea-cli/tests/data/sharded-processes.toml",
        "crates/pangea-cli/tests/data/sharded.placement.toml",
        false,
    )?;
    let ids = cluster.ids();
    ensure!(
        ids == ["one", "one.p1", "one.p2", "two", "two.p1"],
        "every process is started: {ids:?}"
    );
    write_and_read_back(&cluster).await?;
    // Each process stores the rows of its own groups only, and between them
    // every row: `two` (2 processes) hosts groups 0–3 and 4–7 — and group 0 of
    // `global` on both, since it carries the location metadata every process
    // reads (docs/sharding.md).
    timeout(Duration::from_secs(30), async {
        let far = cluster.client("local-2", "frontend").await?;
        let mut held: Vec<BTreeSet<Bytes>> = Vec::new();
        for (id, hosted) in [("two", 0..4), ("two.p1", 4..8)] {
            let page = far
                .scan_at(
                    &id.into(),
                    "ad_profiles",
                    "u/",
                    &ScanOptions {
                        limit: 1_000,
                        ..Default::default()
                    },
                    &Default::default(),
                    Duration::from_secs(5),
                )
                .await?;
            for row in &page.rows {
                let g = group_of(8, &row.key).0;
                ensure!(
                    hosted.contains(&g) || g == 0,
                    "{id} holds {:?} of group {g}",
                    row.key
                );
            }
            held.push(page.rows.into_iter().map(|r| r.key).collect());
        }
        let all: BTreeSet<&Bytes> = held.iter().flatten().collect();
        ensure!(
            all.len() == PROFILES,
            "two's processes hold {} rows",
            all.len()
        );
        ensure!(
            held.iter().all(|h| !h.is_empty()),
            "a process holds no rows"
        );
        anyhow::Ok(())
    })
    .await
    .context("timed out")?
}

async fn write_and_read_back(cluster: &Cluster) -> Result<()> {
    timeout(Duration::from_secs(120), async {
        let near = cluster.client("local-1", "frontend").await?;
        let far = cluster.client("local-2", "frontend").await?;
        let wopts = WriteOptions {
            deadline: Some(Duration::from_secs(10)),
            ..Default::default()
        };

        // Writes land at `one`; each token names its row's group scope.
        let mut tokens = Vec::new();
        for i in 0..PROFILES {
            let m = set("ad_profiles", format!("u/{i:03}"), format!("v{i}"))?;
            tokens.push(near.mutate(m, &wopts).await?.value);
        }
        for u in 0..USERS {
            for t in 0..EVENTS {
                let m = set("events", format!("app,user{u},{t:04}"), format!("e{u}.{t}"))?;
                tokens.push(near.mutate(m, &wopts).await?.value);
            }
        }
        let groups: BTreeSet<&str> = tokens.iter().map(|t| t.scope.as_str()).collect();
        ensure!(
            groups.iter().all(|s| s.starts_with("global/")),
            "tokens name group scopes: {groups:?}"
        );
        ensure!(
            groups.len() >= 6,
            "64 keys fall in most of 8 groups: {groups:?}"
        );
        // One user's events share a group: one token scope per user.
        for u in 0..USERS {
            let first = PROFILES + u * EVENTS;
            let scopes: BTreeSet<&str> = tokens[first..first + EVENTS]
                .iter()
                .map(|t| t.scope.as_str())
                .collect();
            ensure!(scopes.len() == 1, "user{u}'s events in {scopes:?}");
        }

        // `two` serves a watermark read of every write: each group's stream
        // reached it (waiting for it there, or answered by the origin).
        let ropts = |c: Consistency| {
            ReadOptions::default()
                .with_consistency(c)
                .with_deadline(Duration::from_secs(5))
        };
        for (i, t) in tokens.iter().enumerate().take(PROFILES) {
            let key = format!("u/{i:03}");
            let row = far
                .get(
                    "ad_profiles",
                    key.clone(),
                    &ropts(Consistency::Watermark(t.clone())),
                )
                .await?;
            let row = row.value.with_context(|| format!("{key} missing"))?;
            ensure!(cell_value(&row, "profile", b"p") == Some(format!("v{i}").as_bytes()));
        }

        // Get-many across every group, bounded: answered whole, in key order.
        let keys: Vec<Bytes> = (0..PROFILES)
            .map(|i| Bytes::from(format!("u/{i:03}")))
            .collect();
        let bounded = ropts(Consistency::BoundedStaleness { max_ms: 10_000 });
        let all = far.get_many("ad_profiles", &keys, &bounded).await?;
        ensure!(all.value.len() == PROFILES, "{} rows", all.value.len());
        for (i, row) in all.value.iter().enumerate() {
            ensure!(row.key == keys[i], "row {i}: {:?}", row.key);
            ensure!(cell_value(row, "profile", b"p") == Some(format!("v{i}").as_bytes()));
        }

        // A scan over every group, and one inside one user's partition.
        let page = far
            .scan_prefix("ad_profiles", "u/", &ScanOptions::default(), &bounded)
            .await?;
        let got: BTreeSet<&Bytes> = page.value.rows.iter().map(|r| &r.key).collect();
        let missing: Vec<_> = keys.iter().filter(|k| !got.contains(k)).collect();
        ensure!(
            page.value.rows.len() == PROFILES,
            "{} rows from {}, missing {missing:?}",
            page.value.rows.len(),
            page.replica
        );
        let user = far
            .scan_prefix("events", "app,user2,", &ScanOptions::default(), &bounded)
            .await?;
        ensure!(
            user.value.rows.len() == EVENTS,
            "{} events",
            user.value.rows.len()
        );
        ensure!(user.value.rows.iter().enumerate().all(|(t, r)| {
            cell_value(r, "profile", b"p") == Some(format!("e2.{t}").as_bytes())
        }));
        // Pages of 10: every row exactly once, in key order.
        let mut seen: Vec<Bytes> = Vec::new();
        let mut scan = ScanOptions {
            limit: 10,
            ..Default::default()
        };
        loop {
            let page = far
                .scan_prefix("ad_profiles", "u/", &scan, &bounded)
                .await?
                .value;
            ensure!(page.rows.len() <= 10, "a page of {} rows", page.rows.len());
            seen.extend(page.rows.into_iter().map(|r| r.key));
            if page.resume_key.is_empty() {
                break;
            }
            ensure!(seen.len() <= PROFILES, "pages repeat rows: {seen:?}");
            scan.resume_after = page.resume_key;
        }
        ensure!(seen == keys, "pages of 10 read {seen:?}");
        anyhow::Ok(())
    })
    .await
    .context("timed out")?
}

/// A placement move on replicas of many processes (docs/placement.md): 4,000
/// rows under `mv/` move from `global` to `local-1-only` while `one` runs 3
/// processes and `two` 2. The job runs on `one`; `one.p1` and `one.p2` run its
/// parts for their groups. `one.p1` is killed with SIGKILL once its part has
/// copied rows, and restarted: the part resumes from its checkpoint and the
/// job finishes. Then every row reads back from local-1 (a local-2 frontend's
/// reads go there too), and no process of either replica holds a row its
/// placement forbids (the residency audit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_move_on_replicas_of_many_processes_survives_a_kill_of_a_part() -> Result<()> {
    let mut cluster = Cluster::up_with(
        "crates/pangea-cli/tests/data/sharded-processes.toml",
        "crates/pangea-cli/tests/data/sharded-move.placement.toml",
        false,
    )?;
    const ROWS: usize = 4_000;
    let near = cluster.client("local-1", "frontend").await?;
    let keys: Vec<String> = (0..ROWS).map(|i| format!("mv/{i:05}")).collect();
    timeout(Duration::from_secs(120), async {
        let mut tasks = tokio::task::JoinSet::new();
        for lane in 0..16 {
            let (near, keys) = (near.clone(), keys.clone());
            tasks.spawn(async move {
                for k in keys.iter().skip(lane).step_by(16) {
                    let m = set("ad_profiles", k.clone(), format!("v-{k}"))?;
                    near.mutate(m, &common::setup_writes()).await?;
                }
                anyhow::Ok(())
            });
        }
        while let Some(r) = tasks.join_next().await {
            r??;
        }
        anyhow::Ok(())
    })
    .await
    .context("writing timed out")??;

    let ops = cluster.operator("local-1").await?;
    let (runner, job) = ops
        .placement_move("ad_profiles", b"mv/", "local-1-only", None)
        .await?;
    ensure!(runner.as_str() == "one", "runner {runner}");
    let part = format!("{job}.p1");
    let copied_before_kill = timeout(Duration::from_secs(60), async {
        loop {
            if let Some(p) = ops.jobs().await?.into_iter().find(|j| j.id == part)
                && (p.rows_copied > 0 || p.phase == "done")
            {
                return anyhow::Ok(p.rows_copied);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .context("the part on one.p1 never copied a row")??;
    cluster.kill9("one.p1")?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.restart("one.p1")?;
    let done = timeout(Duration::from_secs(90), async {
        loop {
            if let Ok(jobs) = ops.jobs().await
                && let Some(j) = jobs.into_iter().find(|j| j.id == job)
            {
                ensure!(j.phase != "failed", "job failed: {}", j.error);
                if j.phase == "done" {
                    return anyhow::Ok(j);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .context("the job did not finish")??;
    eprintln!(
        "job {job}: {} rows copied by 3 processes; one.p1 killed after {copied_before_kill}",
        done.rows_copied
    );
    ensure!(done.parts == 3, "{done:?}");
    ensure!(
        done.rows_copied >= ROWS as u64,
        "{} rows copied",
        done.rows_copied
    );

    timeout(Duration::from_secs(60), async {
        let far = cluster.client("local-2", "frontend").await?;
        let opts = ReadOptions::default().with_deadline(Duration::from_secs(2));
        for k in keys.iter().step_by(37) {
            for client in [&near, &far] {
                let r = client
                    .get("ad_profiles", Bytes::from(k.clone()), &opts)
                    .await?;
                let row = r.value.with_context(|| format!("{k} is gone"))?;
                ensure!(
                    cell_value(&row, "profile", b"p") == Some(format!("v-{k}").as_bytes()),
                    "{k}: wrong value"
                );
                ensure!(r.region == "local-1", "{k} read from {}", r.region);
            }
        }
        for id in cluster.ids() {
            let a = ops.audit(&id.as_str().into()).await?;
            let disallowed: u64 = a.tables.iter().map(|t| t.rows_disallowed).sum();
            ensure!(
                disallowed == 0,
                "{id} holds {disallowed} rows its placement forbids"
            );
        }
        anyhow::Ok(())
    })
    .await
    .context("reading back timed out")?
}
