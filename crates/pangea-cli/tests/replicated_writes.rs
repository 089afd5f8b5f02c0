//! Writes that wait for replication (`WriteOptions::ack`) on a live three-region
//! cluster with emulated WAN latencies: acknowledged only once the other regions
//! hold the write (read back there at once, never missing), refused up front when
//! the row's policy spans fewer regions than asked, and answered with
//! `NotReplicated` — carrying the token, naming where the write got — when a
//! region cannot be reached by the deadline.

mod common;

use anyhow::{Context, Result, bail, ensure};
use common::{AP, Cluster, EU, US, profile_set};
use pangea_client::{Ack, Error, WriteOptions};
use pangea_proto::v1 as pb;
use std::time::{Duration, Instant};
use tokio::time::timeout;

const WRITES: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_acknowledged_in_every_region_is_read_there_at_once() -> Result<()> {
    let cluster = Cluster::up(true)?;
    timeout(Duration::from_secs(240), async {
        let client = cluster.client(US, "frontend").await?;
        let raw = cluster.raw_client("frontend")?;
        let mut others = Vec::new();
        for region in [EU, AP] {
            for id in cluster.ids_in(region) {
                if !id.contains("batch") {
                    others.push((id.clone(), raw.connect(cluster.addr(&id)?, &id).await?));
                }
            }
        }
        let read_at = |conn: &quinn::Connection, key: String| {
            let req = common::request(
                "frontend",
                2_000_000,
                common::get_request("ad_profiles", key.as_bytes(), None),
            );
            let conn = conn.clone();
            async move {
                let resp = common::call(&conn, &req).await?;
                let Some(pb::client_response::Response::Get(g)) = resp.response else {
                    bail!("get: {:?}", resp.response);
                };
                let value = g
                    .row
                    .as_ref()
                    .and_then(|r| common::cell_value(r, "profile", b"p"))
                    .map(|v| v.to_vec());
                anyhow::Ok(value)
            }
        };

        // Acknowledged in every region: every other region's replicas answer with
        // the write at once. Without waiting, most reads would miss it (the
        // control: the first write of each pair, acked at the origin).
        let (mut waited_ms, mut origin_ms, mut missed_unwaited) = (Vec::new(), Vec::new(), 0);
        for i in 0..WRITES {
            for (ack, key) in [(Ack::Origin, format!("g/rw-o{i}")), (Ack::AllRegions, format!("g/rw-a{i}"))] {
                let value = format!("v{i}");
                let opts = WriteOptions::default().with_ack(ack);
                let started = Instant::now();
                let w = client.mutate(profile_set(key.clone(), value.clone())?, &opts).await?;
                let took = started.elapsed().as_secs_f64() * 1e3;
                for (id, conn) in &others {
                    let got = read_at(conn, key.clone()).await?;
                    if got.as_deref() != Some(value.as_bytes()) {
                        ensure!(ack == Ack::Origin, "{key} acked in every region by {} but {id} has {got:?}", w.replica);
                        missed_unwaited += 1;
                    }
                }
                match ack {
                    Ack::Origin => origin_ms.push(took),
                    _ => waited_ms.push(took),
                }
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "{WRITES} writes each way from {US}: acked at the origin median {:.1} ms \
             ({missed_unwaited} of {} remote reads right after missed them); acked in \
             every region median {:.1} ms (0 missed)",
            median(&mut origin_ms),
            WRITES * others.len(),
            median(&mut waited_ms),
        );
        ensure!(missed_unwaited > 0, "the control missed nothing: the test proves nothing");

        // A policy of one region: waiting for another is refused before writing.
        let eu_client = cluster.client(EU, "frontend").await?;
        let opts = WriteOptions::default().with_ack(Ack::Regions(1));
        match eu_client.mutate(profile_set("eu/rw-refused", "x")?, &opts).await {
            Err(Error::InvalidInput(msg)) => ensure!(
                msg.contains("wait_regions 1: policy eu-resident spans 0 region(s) besides eu-west-1"),
                "{msg}"
            ),
            other => bail!("wait for a region the policy lacks: {other:?}"),
        }
        let read = eu_client
            .get("ad_profiles", "eu/rw-refused", &pangea_client::ReadOptions::default())
            .await?;
        ensure!(read.value.is_none(), "the refused write was written");

        // A region gone: the write happens, and says how far it got.
        for id in cluster.ids_in(AP) {
            cluster.kill9(&id)?;
        }
        let opts = WriteOptions {
            deadline: Some(Duration::from_millis(1_500)),
            ..Default::default()
        }
        .with_ack(Ack::AllRegions);
        match client.mutate(profile_set("g/rw-cut", "x")?, &opts).await {
            Err(Error::NotReplicated { token: Some(t), detail }) => {
                ensure!(
                    detail.contains("applied in 1 of the 2 other region(s) asked: applied in [eu-west-1], not yet in [ap-northeast-1]"),
                    "{detail}"
                );
                ensure!(t.scope.as_str() == "global", "{t:?}");
            }
            other => bail!("a write waiting for a lost region: {other:?}"),
        }
        let (id, conn) = &others[0];
        let got = read_at(conn, "g/rw-cut".into()).await?;
        ensure!(got.as_deref() == Some(&b"x"[..]), "{id}: the write did not happen: {got:?}");
        anyhow::Ok(())
    })
    .await
    .context("replicated-writes test timed out")??;
    cluster.down(2_000)?;
    Ok(())
}
