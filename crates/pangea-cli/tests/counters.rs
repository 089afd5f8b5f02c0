//! Counters on a live local cluster (issue 37, docs/client.md "Counters"):
//! frontends in three regions increment the same frequency caps at once while a
//! replica is killed with SIGKILL and restarted; once quiet, every replica that
//! may hold a counter reads exactly the increments acknowledged to it, and a
//! resident row's counter stays in its region. Writes that do not fit a
//! counter family are refused with an error naming the family.

mod common;

use anyhow::{Result, ensure};
use common::{AP, Cluster, EU, US, call, error_of, eventually, get_request, pangea, request};
use pangea_client::Error;
use pangea_proto::v1 as pb;
use std::time::Duration;

const TABLE: &str = "ad_profiles";
const FAMILY: &str = "impressions";
/// Increments per frontend per counter.
const EACH: usize = 60;

/// The value of `FAMILY`:`column` of `key` at replica `id`, read there
/// (eventual, no fallback): `None` when the replica holds no such row or its
/// placement keeps the row from it.
async fn count_at(c: &Cluster, id: &str, key: &[u8], column: &[u8]) -> Result<Option<i64>> {
    let profile = Cluster::profile_for(id);
    let raw = c.raw_client(profile)?;
    let conn = raw.connect(c.addr(id)?, id).await?;
    let resp = call(
        &conn,
        &request(profile, 2_000_000, get_request(TABLE, key, None)),
    )
    .await?;
    match error_of(&resp) {
        // A replica outside the row's policy refuses to serve it.
        Some((pb::error::Code::PolicyForbids, _)) => return Ok(None),
        Some((code, m)) => anyhow::bail!("{id}: {code:?} {m}"),
        None => {}
    }
    let Some(pb::client_response::Response::Get(g)) = resp.response else {
        anyhow::bail!("{id}: unexpected answer {resp:?}");
    };
    Ok(g.row
        .map(|row| common::cell_value(&row, FAMILY, column).map_or(0, pangea_core::row::count_of)))
}

#[test]
fn increments_from_every_region_all_count_through_a_kill() -> Result<()> {
    let mut c = Cluster::up(false)?;
    let rt = common::runtime()?;
    // (row, column, regions that count into it): a global row counted
    // everywhere, an EU-resident row counted in the EU.
    let global: &[u8] = b"us/user-1";
    let resident: &[u8] = b"eu/user-2";
    let (acked, unknown) = rt.block_on(async {
        let mut tasks = Vec::new();
        for (region, rows) in [
            (US, vec![global]),
            (EU, vec![global, resident]),
            (AP, vec![global]),
        ] {
            let fe = c.client(region, "frontend").await?;
            tasks.push(tokio::spawn(async move {
                let (mut acked, mut unknown) = (Vec::new(), Vec::new());
                for i in 0..EACH {
                    for row in &rows {
                        let campaign = if i % 2 == 0 { "camp-a" } else { "camp-b" };
                        let r = fe
                            .increment(
                                TABLE,
                                row.to_vec(),
                                FAMILY,
                                campaign,
                                1,
                                &common::setup_writes(),
                            )
                            .await;
                        match r {
                            Ok(_) => acked.push((row.to_vec(), campaign)),
                            // Sent, outcome unknown: it may count (never resent).
                            Err(Error::Ambiguous { .. }) => unknown.push((row.to_vec(), campaign)),
                            Err(e) => {
                                return Err(anyhow::anyhow!("{region}: increment failed: {e}"));
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Ok::<_, anyhow::Error>((acked, unknown))
            }));
        }
        // Mid-way, a replica of the EU (where the resident row lives) dies.
        tokio::time::sleep(Duration::from_millis(300)).await;
        c.kill9("euw1-b")?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        c.restart("euw1-b")?;
        let (mut acked, mut unknown) = (Vec::new(), Vec::new());
        for t in tasks {
            let (a, u) = t.await??;
            acked.extend(a);
            unknown.extend(u);
        }
        Ok::<_, anyhow::Error>((acked, unknown))
    })?;
    println!(
        "{} increments acknowledged, {} unknown",
        acked.len(),
        unknown.len()
    );
    ensure!(
        acked.len() + unknown.len() == EACH * 4,
        "every increment was acknowledged or ambiguous"
    );
    let count = |set: &[(Vec<u8>, &str)], row: &[u8], col: &str| {
        set.iter().filter(|(r, c)| r == row && *c == col).count() as i64
    };
    rt.block_on(async {
        for (row, in_eu_only) in [(global, false), (resident, true)] {
            for col in ["camp-a", "camp-b"] {
                let (low, high) = (
                    count(&acked, row, col),
                    count(&acked, row, col) + count(&unknown, row, col),
                );
                ensure!(low > 0, "nothing counted into {col}");
                for id in c.ids() {
                    let holds = !in_eu_only || c.region_of(&id) == Some(EU);
                    let got = eventually(
                        Duration::from_secs(30),
                        Duration::from_millis(200),
                        "counters converged",
                        || async {
                            let got = count_at(&c, &id, row, col.as_bytes()).await?;
                            Ok(match (holds, got) {
                                (true, Some(n)) if (low..=high).contains(&n) => Some(got),
                                (false, None) => Some(got),
                                _ => None,
                            })
                        },
                    )
                    .await;
                    ensure!(
                        got.is_ok(),
                        "{id}: {col} of {:?} never read {low}..={high} (holds: {holds}): {:?}",
                        String::from_utf8_lossy(row),
                        count_at(&c, &id, row, col.as_bytes()).await
                    );
                }
                // Every replica holding it reads the same value.
                let mut seen = std::collections::BTreeSet::new();
                for id in c.ids() {
                    if let Some(n) = count_at(&c, &id, row, col.as_bytes()).await? {
                        seen.insert(n);
                    }
                }
                ensure!(seen.len() == 1, "replicas disagree on {col}: {seen:?}");
            }
        }
        Ok::<_, anyhow::Error>(())
    })?;

    // Writes that do not fit the family's kind are refused, naming it; and the
    // command line counts and prints counters.
    rt.block_on(async {
        let fe = c.client(US, "frontend").await?;
        let set = common::profile_set("us/user-1", &b"v"[..])?;
        let mut bad = set.to_proto();
        bad.mutations[0].kind = Some(pb::mutation::Kind::SetCell(pb::mutation::SetCell {
            family: FAMILY.into(),
            column: b"camp-a".to_vec().into(),
            value: 7i64.to_be_bytes().to_vec().into(),
        }));
        let m = pangea_client::RowMutation::from_proto(bad, &pangea_core::Limits::default())?;
        let e = fe.mutate(m, &common::setup_writes()).await.unwrap_err();
        ensure!(
            e.to_string().contains("\"impressions\"") && e.to_string().contains("counter family"),
            "set into a counter: {e}"
        );
        let e = fe
            .increment(
                TABLE,
                "us/user-1",
                "profile",
                "p",
                1,
                &common::setup_writes(),
            )
            .await
            .unwrap_err();
        ensure!(
            e.to_string().contains("\"profile\"") && e.to_string().contains("not a counter family"),
            "increment of cells: {e}"
        );
        Ok::<_, anyhow::Error>(())
    })?;
    let file = c.cluster_path();
    let file = file.to_str().unwrap_or_default();
    let out = pangea(
        &[
            "incr",
            "--cluster",
            file,
            "--region",
            US,
            "us/user-3",
            "impressions:camp-c=5",
            "impressions:camp-c=-2",
        ],
        Duration::from_secs(20),
    )?;
    ensure!(
        out.status.success(),
        "incr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = pangea(
        &["get", "--cluster", file, "--region", US, "us/user-3"],
        Duration::from_secs(20),
    )?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        stdout.contains("impressions:camp-c") && stdout.contains("= 3 (counter)"),
        "get: {stdout}"
    );
    let out = pangea(
        &[
            "incr",
            "--cluster",
            file,
            "--region",
            US,
            "us/user-3",
            "impressions:camp-c=x",
        ],
        Duration::from_secs(20),
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && stderr.contains("whole number"),
        "bad delta: {stderr}"
    );
    // Scan flags (docs/client.md "Filters"): a reverse scan of a key range, the
    // replica keeping only camp-a's counters (us/user-3 has none: left out).
    let scan = |extra: &[&str]| -> Result<serde_json::Value> {
        let mut args = vec!["scan", "--cluster", file, "--region", US, "--json"];
        args.extend_from_slice(extra);
        let out = pangea(&args, Duration::from_secs(20))?;
        ensure!(
            out.status.success(),
            "scan {extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    let v = scan(&[
        "--reverse",
        "--through",
        "us/user-3",
        "--column-regex",
        "camp-a",
        "us/",
    ])?;
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    let keys: Vec<&str> = rows.iter().filter_map(|r| r["key"].as_str()).collect();
    ensure!(keys == ["us/user-1"], "reverse scan: {v}");
    let columns: Vec<&str> = rows[0]["cells"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["column"].as_str())
        .collect();
    ensure!(columns == ["camp-a"], "camp-a only: {v}");
    let v = scan(&[
        "--after",
        "us/user-1",
        "--filter",
        r#"{"family":"impressions"}"#,
        "us/",
    ])?;
    ensure!(
        v["rows"]
            .as_array()
            .is_some_and(|r| r.iter().all(|r| r["key"] != "us/user-1")),
        "--after us/user-1: {v}"
    );
    let out = pangea(
        &[
            "scan",
            "--cluster",
            file,
            "--region",
            US,
            "--column-regex",
            "(",
            "us/",
        ],
        Duration::from_secs(20),
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && stderr.contains("--column-regex"),
        "bad regex: {stderr}"
    );
    event_times(file)?;
    c.down(common::CLEANUP_GRACE_MS)?;
    Ok(())
}

/// Event time (docs/client.md "Event time"): `ad_profiles` takes event times up
/// to 90 days back. A cell written 20 days back reads at that time; one 40 days
/// back is past the `events` family's 30-day TTL and never shows; one 100 days
/// back is refused, naming the table and the bound; a counter refuses one.
fn event_times(file: &str) -> Result<()> {
    const DAY_MS: u64 = 86_400_000;
    let put = |args: &[&str]| {
        let mut all = vec!["put", "--cluster", file, "--region", US];
        all.extend_from_slice(args);
        pangea(&all, Duration::from_secs(20))
    };
    for (ago, column) in [("20d", "click:20d"), ("40d", "click:40d")] {
        let out = put(&[
            "--event-time",
            ago,
            "us/user-9",
            &format!("events:{column}=x"),
        ])?;
        ensure!(
            out.status.success(),
            "put --event-time {ago}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = put(&["--event-time", "100d", "us/user-9", "events:click:100d=x"])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success()
            && stderr.contains("\"ad_profiles\"")
            && stderr.contains("at most 7776000000 ms back"),
        "100 days back: {stderr}"
    );
    let out = pangea(
        &[
            "incr",
            "--cluster",
            file,
            "--region",
            US,
            "us/user-9",
            "impressions:camp-z",
        ],
        Duration::from_secs(20),
    )?;
    ensure!(out.status.success(), "a plain increment still counts");
    // The writes went to the nearest replica; a read may reach another first.
    let get = || -> Result<serde_json::Value> {
        let out = pangea(
            &[
                "get",
                "--cluster",
                file,
                "--region",
                US,
                "--family",
                "events",
                "--json",
                "us/user-9",
            ],
            Duration::from_secs(20),
        )?;
        ensure!(
            out.status.success(),
            "get: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    let cells_of = |v: &serde_json::Value| -> Vec<(String, u64)> {
        v["row"]["cells"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| {
                Some((
                    c["column"].as_str()?.to_owned(),
                    c["timestamp"].as_u64()? >> 16,
                ))
            })
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut v = get()?;
    while cells_of(&v).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        v = get()?;
    }
    let cells = cells_of(&v);
    ensure!(
        cells.len() == 1 && cells[0].0 == "click:20d",
        "only the 20-day-old event shows: {v}"
    );
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64;
    let age = now_ms.saturating_sub(cells[0].1);
    ensure!(
        (20 * DAY_MS..20 * DAY_MS + 120_000).contains(&age),
        "the cell is stamped 20 days back, not {age} ms: {v}"
    );
    Ok(())
}
