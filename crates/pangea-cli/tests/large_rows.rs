//! Large rows on a live replica: 1,000 rows of 100 KB come back whole through
//! get-many and scans, whose responses are paged by bytes as well as rows, and a
//! write that would grow a row past `Limits::row_bytes_max` is refused naming the
//! limit, as is a read with a key past `Limits::row_key_bytes_max`.

mod common;

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use common::{Cluster, profile_set};
use pangea_client::{Error, ReadOptions, ScanOptions, WriteOptions};
use pangea_proto::v1 as pb;
use std::time::Duration;
use tokio::time::timeout;

const ROWS: usize = 1_000;
const VALUE: usize = 100_000;
const TASKS: usize = 16;

/// Row `i`'s value: 100 KB, its index in the first bytes.
fn value(i: usize) -> Bytes {
    let mut v = vec![(i % 251) as u8; VALUE];
    v[..8].copy_from_slice(&(i as u64).to_be_bytes());
    Bytes::from(v)
}

fn key(i: usize) -> Bytes {
    Bytes::from(format!("big/{i:04}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_rows_of_100_kb_are_read_back_in_pages_by_bytes() -> Result<()> {
    let cluster = Cluster::up_with(
        "topology/single-replica.toml",
        "topology/single-replica.placement.toml",
        false,
    )?;
    timeout(Duration::from_secs(300), async {
        let client = cluster.client("local-1", "frontend").await?;
        let wopts = WriteOptions {
            deadline: Some(Duration::from_secs(10)),
            ..Default::default()
        };
        let mut tasks = tokio::task::JoinSet::new();
        for t in 0..TASKS {
            let (client, wopts) = (client.clone(), wopts.clone());
            tasks.spawn(async move {
                for i in (t..ROWS).step_by(TASKS) {
                    let k = String::from_utf8(key(i).to_vec())?;
                    client.mutate(profile_set(k, value(i))?, &wopts).await?;
                }
                anyhow::Ok(())
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.context("writer panicked")??;
        }
        let ropts = ReadOptions::default().with_deadline(Duration::from_secs(20));
        let check = |rows: &[pb::Row], from: usize| -> Result<()> {
            for (n, row) in rows.iter().enumerate() {
                let i = from + n;
                ensure!(
                    row.key == key(i),
                    "row {n}: key {:?}, want {:?}",
                    row.key,
                    key(i)
                );
                let got = common::cell_value(row, "profile", b"p");
                ensure!(got == Some(&value(i)[..]), "row {:?}: wrong value", row.key);
            }
            Ok(())
        };

        // Get-many of every row: 100 MB, far past one frame (17 MiB). The replica
        // answers the first keys' rows up to its page bytes; the client asks again.
        let keys: Vec<Bytes> = (0..ROWS).map(key).collect();
        let all = client.get_many("ad_profiles", &keys, &ropts).await?;
        ensure!(
            all.value.len() == ROWS,
            "{} rows of {ROWS}",
            all.value.len()
        );
        check(&all.value, 0)?;
        ensure!(all.attempts >= 24, "100 MB in {} requests", all.attempts);

        // One raw request shows the page: the default 4 MiB, and one row more at most.
        let raw = cluster.raw_client("frontend")?;
        let conn = raw.connect(cluster.addr("solo")?, "solo").await?;
        let req = common::request(
            "frontend",
            10_000_000,
            pb::client_request::Request::GetMany(pb::GetManyRequest {
                table: "ad_profiles".into(),
                row_keys: keys.clone(),
                ..Default::default()
            }),
        );
        let resp = common::call(&conn, &req).await?;
        let Some(pb::client_response::Response::GetMany(g)) = resp.response else {
            bail!("get-many: {:?}", resp.response);
        };
        let bytes: usize = g.rows.iter().map(pangea_proto::Message::encoded_len).sum();
        println!(
            "one get-many response: {} rows, {bytes} bytes",
            g.rows.len()
        );
        ensure!(
            (1..ROWS).contains(&g.rows.len()),
            "{} rows in one page",
            g.rows.len()
        );
        ensure!(bytes < (4 << 20) + VALUE + 1_000, "a page of {bytes} bytes");
        check(&g.rows, 0)?;
        conn.close(0u32.into(), b"done");

        // Scans: pages end at their bytes (here 1 MiB) before their rows (1,000).
        let mut scan = ScanOptions {
            limit: 1_000,
            max_bytes: 1 << 20,
            ..Default::default()
        };
        let (mut seen, mut pages) = (0, 0);
        loop {
            let page = client
                .scan_prefix("ad_profiles", "big/", &scan, &ropts)
                .await?;
            let bytes: usize = page
                .value
                .rows
                .iter()
                .map(pangea_proto::Message::encoded_len)
                .sum();
            ensure!(
                bytes < (1 << 20) + VALUE + 1_000,
                "a scan page of {bytes} bytes"
            );
            check(&page.value.rows, seen)?;
            seen += page.value.rows.len();
            pages += 1;
            if page.value.resume_key.is_empty() {
                break;
            }
            scan.resume_after = page.value.resume_key;
        }
        ensure!(seen == ROWS, "the scan saw {seen} rows of {ROWS}");
        ensure!(
            pages >= 90,
            "{ROWS} rows of 100 KB in {pages} pages of 1 MiB"
        );

        // A row may hold at most 16 MiB: the write that would pass it is refused,
        // naming the row's size after it and the limit, and the row is unchanged.
        let big = Bytes::from(vec![7u8; 4 << 20]);
        for c in 0..5 {
            let m = pangea_client::RowMutation::new(
                "ad_profiles",
                "huge",
                vec![pangea_client::Mutation::SetCell {
                    family: "profile".into(),
                    column: Bytes::from(format!("c{c}")),
                    value: big.clone(),
                }],
                &pangea_core::Limits::default(),
            )?;
            let r = client.mutate(m, &wopts).await;
            if c < 3 {
                r?;
                continue;
            }
            // 4 + 4 + 4 MiB held, plus 4 more is 16 MiB and 8 bytes: refused.
            match r {
                Err(Error::InvalidInput(msg)) => {
                    ensure!(
                        msg.contains("row after the write is 16777224 bytes, limit 16777216"),
                        "{msg}"
                    );
                }
                other => bail!("write {c} past the row limit: {other:?}"),
            }
        }
        let row = client.get("ad_profiles", "huge", &ropts).await?;
        let held = row
            .value
            .as_ref()
            .map_or(0, |r| r.families.iter().flat_map(|f| &f.cells).count());
        ensure!(held == 3, "the refused writes left {held} columns");

        // Every read checks its keys against the 4 KiB row-key limit, naming the
        // field, the size and the limit.
        let long = Bytes::from(vec![b'k'; 4097]);
        let refused = |what: &str, r: Result<(), Error>, field: &str| -> Result<()> {
            match r {
                Err(Error::InvalidInput(msg))
                    if msg.contains(&format!("{field}: row key is 4097 bytes, limit 4096")) =>
                {
                    Ok(())
                }
                other => bail!("{what} with a 4097-byte key: {other:?}"),
            }
        };
        let get = client.get("ad_profiles", long.clone(), &ropts).await;
        refused("get", get.map(|_| ()), "row_key")?;
        let many = client
            .get_many("ad_profiles", &[key(0), long.clone()], &ropts)
            .await;
        refused("get-many", many.map(|_| ()), "row_keys[1]")?;
        let scan = client
            .scan_prefix("ad_profiles", long.clone(), &ScanOptions::default(), &ropts)
            .await;
        refused("scan", scan.map(|_| ()), "prefix")?;
        let resume = ScanOptions {
            resume_after: long.clone(),
            ..Default::default()
        };
        let scan = client
            .scan_prefix("ad_profiles", "big/", &resume, &ropts)
            .await;
        refused("scan resumed", scan.map(|_| ()), "resume_after")?;
        anyhow::Ok(())
    })
    .await
    .context("large-rows test timed out")??;
    cluster.down(2_000)?;
    Ok(())
}
