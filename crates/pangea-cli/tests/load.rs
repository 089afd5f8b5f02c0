//! `pangea load` on a real local cluster: ~1,000 rows from NDJSON and ~1,000 from
//! length-delimited protobuf, written from us-east-1 and read back from eu-west-1
//! byte for byte (replication along the trees; `eu/` rows, which are eu-resident,
//! written at an eu-west-1 replica); a malformed line stops the load before it, is
//! named by its line number, and nothing after it is written; the report's counts
//! add up.

mod common;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use common::{Cluster, EU, US, call, eventually, get_request, pangea, request};
use pangea_client::{Client, ReadOptions};
use pangea_proto::Message;
use pangea_proto::v1 as pb;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

const ROWS: usize = 1_000;
/// Every this many rows, one is eu-resident (`eu/` prefix).
const EU_EVERY: usize = 10;
const LOAD_TIME_MAX: Duration = Duration::from_secs(60);
const REPLICATION_TIME_MAX: Duration = Duration::from_secs(20);
const TABLE: &str = "ad_profiles";

/// Expected cells of one row: (family, column) -> value.
type Cells = BTreeMap<(String, Vec<u8>), Vec<u8>>;

/// Deterministic bytes of every value 0..=255 (most values are not UTF-8).
fn bytes_for(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = pangea_core::rng::Rng::new(seed);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &c)| acc | u32::from(c) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(A[(n >> (18 - 6 * i) & 63) as usize]));
        }
        for _ in chunk.len()..3 {
            out.push('=');
        }
    }
    out
}

fn key(kind: &str, i: usize) -> String {
    if i.is_multiple_of(EU_EVERY) {
        format!("eu/load-{kind}-{i:04}")
    } else {
        format!("load/{kind}/{i:04}")
    }
}

/// NDJSON rows: a binary profile (base64) and, on every other row, a text event.
fn ndjson_rows(path: &Path) -> Result<BTreeMap<String, Cells>> {
    let mut want = BTreeMap::new();
    let mut text = String::new();
    for i in 0..ROWS {
        let k = key("j", i);
        let blob = bytes_for(i as u64 + 1, 100 + i % 300);
        let mut cells = Cells::new();
        cells.insert(("profile".into(), b"p".to_vec()), blob.clone());
        let mut json =
            serde_json::json!({ "key": k, "cells": { "profile:p": { "b64": base64(&blob) } } });
        if i % 2 == 0 {
            let event = format!("clicked ad {i} ✓");
            json["cells"]["events:click"] = serde_json::Value::String(event.clone());
            cells.insert(("events".into(), b"click".to_vec()), event.into_bytes());
        }
        text += &json.to_string();
        text.push('\n');
        want.insert(k, cells);
    }
    std::fs::write(path, text)?;
    Ok(want)
}

/// Protobuf rows: varint-length-prefixed `RowMutation`s with an empty table.
fn protobuf_rows(path: &Path) -> Result<BTreeMap<String, Cells>> {
    let mut want = BTreeMap::new();
    let mut out = Vec::new();
    for i in 0..ROWS {
        let k = key("p", i);
        let blob = bytes_for(1_000_000 + i as u64, 50 + i % 500);
        let m = pb::RowMutation {
            event_time_ms: None,
            table: String::new(),
            row_key: Bytes::from(k.clone()),
            mutations: vec![pb::Mutation {
                kind: Some(pb::mutation::Kind::SetCell(pb::mutation::SetCell {
                    family: "profile".into(),
                    column: Bytes::from_static(b"p"),
                    value: Bytes::from(blob.clone()),
                })),
            }],
        };
        m.encode_length_delimited(&mut out)?;
        let mut cells = Cells::new();
        cells.insert(("profile".into(), b"p".to_vec()), blob);
        want.insert(k, cells);
    }
    std::fs::write(path, out)?;
    Ok(want)
}

fn payload_bytes(want: &BTreeMap<String, Cells>) -> u64 {
    want.iter()
        .map(|(k, cells)| {
            k.len()
                + cells
                    .iter()
                    .map(|((_, c), v)| c.len() + v.len())
                    .sum::<usize>()
        })
        .sum::<usize>() as u64
}

/// `pangea load --json`: the report, after checking the command succeeded.
fn load_json(cluster: &Cluster, input: &Path) -> Result<serde_json::Value> {
    let cluster_file = cluster.cluster_path();
    let args = [
        "load",
        "--cluster",
        cluster_file.to_str().context("path")?,
        "--region",
        US,
        "--table",
        TABLE,
        "--json",
        input.to_str().context("path")?,
    ];
    let out = pangea(&args, LOAD_TIME_MAX)?;
    ensure!(
        out.status.success(),
        "pangea load {} failed:\n{}{}",
        input.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The report says every row was written once, its bytes, and where.
fn check_report(r: &serde_json::Value, want: &BTreeMap<String, Cells>) -> Result<()> {
    let n = want.len() as u64;
    ensure!(r["rows"] == n, "rows: {r}");
    ensure!(r["records"] == n, "records: {r}");
    ensure!(
        r["rejected"] == 0 && r["failed"] == 0 && r["skipped"] == 0,
        "{r}"
    );
    ensure!(r["write_latency"]["count"] == n, "latency count: {r}");
    ensure!(r["bytes"] == payload_bytes(want), "bytes: {r}");
    ensure!(r["stopped_at"].is_null(), "{r}");
    let at = r["written_at"].as_object().context("written_at")?;
    let total: u64 = at.values().filter_map(|v| v.as_u64()).sum();
    ensure!(total == n, "written_at adds up to {total}: {r}");
    // Rows are written once, from us-east-1, at the nearest replica their policy
    // allows: eu-resident rows only at eu-west-1 replicas; global rows mostly at
    // us-east-1 ones (the library's "nearest" is by measured round trip, which under
    // 64 writes in flight includes queueing, so some go to the next region).
    let in_region = |prefix: &str| -> u64 {
        at.iter()
            .filter(|(id, _)| id.starts_with(prefix))
            .filter_map(|(_, v)| v.as_u64())
            .sum()
    };
    let eu_rows = want.keys().filter(|k| k.starts_with("eu/")).count() as u64;
    ensure!(
        in_region("euw1-") >= eu_rows,
        "eu-west-1 took fewer writes than the {eu_rows} eu-resident rows: {r}"
    );
    // Under heavy machine load the local replicas' measured round trips (which
    // include their queueing) can exceed the emulated 75 ms to eu-west-1, and the
    // client then rightly prefers eu-west-1 for part of the global rows: a run here
    // at load average 10 saw 438 of 934 at use1-*. The loader's region must still take a real share.
    ensure!(
        in_region("use1-") >= (n - eu_rows) / 5,
        "too few global rows were written in the loader's region: {r}"
    );
    ensure!(
        !at.contains_key("use1-batch"),
        "a frontend load wrote at the batch replica: {r}"
    );
    Ok(())
}

/// Which rows of `want` the client does not (yet) see with exactly the expected cells.
async fn missing(client: &Client, want: &BTreeMap<String, Cells>) -> Result<Vec<String>> {
    let opts = ReadOptions::default().with_deadline(Duration::from_secs(5));
    let mut missing = Vec::new();
    // One request per policy and up to 200 keys.
    for eu in [false, true] {
        let keys: Vec<&String> = want.keys().filter(|k| k.starts_with("eu/") == eu).collect();
        for chunk in keys.chunks(200) {
            let req: Vec<Bytes> = chunk.iter().map(|k| Bytes::from(k.to_string())).collect();
            let resp = client.get_many(TABLE, &req, &opts).await?;
            let mut got: BTreeMap<Vec<u8>, Cells> = BTreeMap::new();
            for row in &resp.value {
                let cells = got.entry(row.key.to_vec()).or_default();
                for f in &row.families {
                    for c in &f.cells {
                        cells
                            .entry((f.name.clone(), c.column.to_vec()))
                            .or_insert_with(|| c.value.to_vec());
                    }
                }
            }
            for k in chunk {
                if got.get(k.as_bytes()) != want.get(*k) {
                    missing.push((*k).clone());
                }
            }
        }
    }
    Ok(missing)
}

async fn wait_replicated(client: &Client, want: &BTreeMap<String, Cells>) -> Result<()> {
    let last = std::sync::Mutex::new(Vec::new());
    let last = &last;
    let r = eventually(
        REPLICATION_TIME_MAX,
        Duration::from_millis(200),
        "loaded rows readable in eu-west-1",
        || async move {
            let m = missing(client, want).await?;
            let done = m.is_empty();
            if let Ok(mut l) = last.lock() {
                *l = m;
            }
            Ok(done.then_some(()))
        },
    )
    .await;
    r.with_context(|| {
        let last = last.lock().map(|l| l.clone()).unwrap_or_default();
        format!(
            "{} of {} rows missing or wrong, e.g. {:?}",
            last.len(),
            want.len(),
            last.iter().take(5).collect::<Vec<_>>()
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_load_from_ndjson_and_protobuf_replicates_and_stops_at_a_bad_line() -> Result<()> {
    // With the topology's WAN delays: "nearest" then means the loader's region.
    let cluster = Cluster::up(true)?;
    let work = tempfile::tempdir()?;

    // ~1,000 rows from NDJSON and ~1,000 from protobuf, loaded from us-east-1.
    let ndjson = work.path().join("profiles.ndjson");
    let want_j = ndjson_rows(&ndjson)?;
    let report = load_json(&cluster, &ndjson)?;
    check_report(&report, &want_j).context("NDJSON load report")?;
    ensure!(report["format"] == "ndjson", "{report}");

    let proto = work.path().join("profiles.pb");
    let want_p = protobuf_rows(&proto)?;
    let report = load_json(&cluster, &proto)?;
    check_report(&report, &want_p).context("protobuf load report")?;
    ensure!(report["format"] == "protobuf", "{report}");

    // Every row, read from another region, with the right bytes.
    let eu = cluster.client(EU, "frontend").await?;
    wait_replicated(&eu, &want_j).await?;
    wait_replicated(&eu, &want_p).await?;

    // A malformed line 11: the load stops there, says so by line number, and writes
    // lines 1-10 only.
    let bad = work.path().join("bad.ndjson");
    let mut lines = Vec::new();
    let mut before = BTreeMap::new();
    let mut after = Vec::new();
    for i in 1..=20 {
        let k = format!("bad/{i:04}");
        if i == 11 {
            lines.push(format!(
                r#"{{"key": "{k}", "cells": {{"profile:p": "v{i}"}}"#
            ));
            continue;
        }
        lines.push(format!(
            r#"{{"key": "{k}", "cells": {{"profile:p": "v{i}"}}}}"#
        ));
        if i < 11 {
            let mut cells = Cells::new();
            cells.insert(
                ("profile".into(), b"p".to_vec()),
                format!("v{i}").into_bytes(),
            );
            before.insert(k, cells);
        } else {
            after.push(k);
        }
    }
    std::fs::write(&bad, lines.join("\n") + "\n")?;
    let cluster_file = cluster.cluster_path();
    let bad_s = bad.to_str().context("path")?;
    let args = [
        "load",
        "--cluster",
        cluster_file.to_str().context("path")?,
        "--region",
        US,
        "--table",
        TABLE,
        bad_s,
    ];
    let out = pangea(&args, LOAD_TIME_MAX)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success(),
        "a malformed line loaded:\n{stdout}{stderr}"
    );
    ensure!(
        stderr.contains(&format!("{bad_s}:11: invalid JSON")),
        "the bad line is not named:\n{stderr}"
    );
    ensure!(
        stderr.contains("--skip 10") && stderr.contains("10 rows written"),
        "no resume hint:\n{stderr}"
    );
    ensure!(
        stdout.contains("loaded 10 rows") && stdout.contains("stopped at record 11"),
        "report:\n{stdout}"
    );
    wait_replicated(&eu, &before).await?;
    // Nothing after the bad line, on any replica.
    let raw_frontend = cluster.raw_client("frontend")?;
    let raw_batch = cluster.raw_client("batch-training")?;
    for id in cluster.ids() {
        let profile = Cluster::profile_for(&id);
        let raw = if profile == "frontend" {
            &raw_frontend
        } else {
            &raw_batch
        };
        let conn = raw.connect(cluster.addr(&id)?, &id).await?;
        for k in &after {
            let resp = call(
                &conn,
                &request(profile, 2_000_000, get_request(TABLE, k.as_bytes(), None)),
            )
            .await?;
            match resp.response {
                Some(pb::client_response::Response::Get(g)) => ensure!(
                    g.row.is_none_or(|r| r.families.is_empty()),
                    "{k}, after the bad line, was written ({id} has it)"
                ),
                other => anyhow::bail!("{id}: unexpected answer {other:?}"),
            }
        }
    }

    // --keep-going: the bad line is rejected and counted, the rest written.
    let mut args = args.to_vec();
    args.insert(1, "--keep-going");
    args.insert(1, "--json");
    let out = pangea(&args, LOAD_TIME_MAX)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "rejects must fail the exit status");
    ensure!(
        stderr.contains(&format!("rejected {bad_s}:11:")),
        "{stderr}"
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    ensure!(
        r["rows"] == 19 && r["rejected"] == 1 && r["records"] == 20 && r["failed"] == 0,
        "{r}"
    );
    Ok(())
}
