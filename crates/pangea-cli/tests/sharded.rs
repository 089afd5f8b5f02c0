//! Rows spread over shard groups on live replicas (docs/sharding.md): with
//! `shard_groups = 8`, each write's token names its row's group scope, the
//! other region applies every group's stream (watermark reads with those
//! tokens are served there), and get-many and scans whose rows span groups are
//! answered whole under bounded staleness, each group's watermarks checked.

mod common;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use common::{Cluster, cell_value};
use pangea_client::{Consistency, Mutation, ReadOptions, RowMutation, ScanOptions, WriteOptions};
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
        ensure!(
            page.value.rows.len() == PROFILES,
            "{} rows",
            page.value.rows.len()
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
        anyhow::Ok(())
    })
    .await
    .context("timed out")?
}
