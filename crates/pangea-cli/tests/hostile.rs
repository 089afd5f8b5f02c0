//! Hostile traffic from an authenticated client (issue 31): frames announced large
//! and sent slowly on many streams pin at most the replica's frame budgets
//! (docs/operations.md, `frame_budget_*`), refused streams are told why, and an
//! ordinary 8 MiB write from another connection goes through meanwhile.

mod common;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use common::{Cluster, RawClient, US};
use pangea_net::{Credential, certs, tls};
use pangea_proto::v1 as pb;
use std::time::{Duration, Instant};

const ANNOUNCED: u32 = 16 << 20;
const SENT: usize = 15 << 20;
const MIB: u64 = 1 << 20;

/// Resident memory of process `pid`, from /proc.
fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("no VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kb * 1024)
}

/// Opens `streams` request streams on `conn`, each announcing a 16 MiB frame and
/// sending 15 MiB of it, never the rest. Returns, per stream, whether the replica
/// refused it (and said why before stopping it).
async fn pin(conn: quinn::Connection, streams: usize) -> Result<Vec<bool>> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..streams {
        let conn = conn.clone();
        tasks.spawn(async move {
            let (mut send, mut recv) = conn.open_bi().await?;
            send.write_all(&ANNOUNCED.to_be_bytes()).await?;
            // As much of the body as goes out in a few seconds (a writer whose
            // stream the replica stopped may not be woken while it waits for
            // connection credit, so the loop is bounded in time).
            let chunk = vec![0x5a; 1 << 20];
            let _ = tokio::time::timeout(Duration::from_secs(4), async {
                let mut sent = 0;
                while sent < SENT {
                    if send.write_all(&chunk).await.is_err() {
                        break; // stopped by the replica
                    }
                    sent += chunk.len();
                }
            })
            .await;
            // A refused stream gets an answer naming the budget; an accepted one
            // gets nothing while its frame is incomplete.
            let answer = tokio::time::timeout(
                Duration::from_secs(2),
                pangea_net::read_frame::<pb::ClientResponse>(
                    &mut recv,
                    pangea_net::FRAME_BYTES_MAX,
                ),
            )
            .await;
            let refused = match answer {
                Ok(Ok(Some(resp))) => match resp.response {
                    Some(pb::client_response::Response::Error(e)) => {
                        ensure!(e.message.contains("budget"), "{}", e.message);
                        true
                    }
                    other => anyhow::bail!("an incomplete frame was answered: {other:?}"),
                },
                _ => false,
            };
            // Hold the stream (and what the replica buffered for it) open.
            tokio::time::sleep(Duration::from_secs(3)).await;
            drop(send);
            anyhow::Ok(refused)
        });
    }
    let mut out = Vec::new();
    while let Some(r) = tasks.join_next().await {
        out.push(r??);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_frames_stay_within_the_budgets() -> Result<()> {
    let c = Cluster::up(false)?;
    let at = "use1-a";
    let pid = c.pid(at)?;
    let addr = c.addr(at)?;
    let ca = certs::load_ca(&c.file.certs)?;
    let attacker = || -> Result<RawClient> {
        let own =
            certs::load_credential(&c.file.certs, &Credential::Client("client-frontend".into()))?;
        RawClient::new(tls::client_config(&ca, own)?)
    };
    let fe = c.client(US, "frontend").await?;
    let baseline = rss_bytes(pid)?;
    // Watch the replica's memory while the attacks run.
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(baseline));
    let watching = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(rss) = rss_bytes(pid) {
                    peak.fetch_max(rss, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    // 1. One connection, 80 streams (the reported attack): at most the connection
    // budget (64 MiB, four 16 MiB frames) is read; the rest are refused.
    let conn = attacker()?.connect(addr, at).await?;
    let attack = tokio::spawn(pin(conn.clone(), 80));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Meanwhile an ordinary 8 MiB write from another connection goes through.
    let started = Instant::now();
    let big = pangea_client::RowMutation::new(
        "ad_profiles",
        "us/big",
        vec![pangea_client::Mutation::SetCell {
            family: "profile".into(),
            column: Bytes::from_static(b"p"),
            value: Bytes::from(vec![7u8; 8 << 20]),
        }],
        &pangea_core::Limits::default(),
    )?;
    fe.mutate(
        big,
        &pangea_client::WriteOptions {
            deadline: Some(Duration::from_secs(10)),
        },
    )
    .await
    .context("an 8 MiB write during the attack")?;
    eprintln!("8 MiB write during the attack: {:?}", started.elapsed());
    let refused = attack.await??;
    let accepted = refused.iter().filter(|r| !**r).count();
    ensure!(
        accepted <= 4,
        "{accepted} frames of 16 MiB read on one connection"
    );
    ensure!(refused.len() - accepted >= 76, "refusals: {refused:?}");
    let one = peak.load(std::sync::atomic::Ordering::Relaxed);
    drop(conn);

    // 2. Six connections of 20 streams: the replica-wide budget (256 MiB) holds.
    let mut attacks = Vec::new();
    for _ in 0..6 {
        let conn = attacker()?.connect(addr, at).await?;
        attacks.push(tokio::spawn(pin(conn, 20)));
    }
    let mut accepted = 0;
    for a in attacks {
        accepted += a.await??.iter().filter(|r| !**r).count();
    }
    ensure!(
        accepted <= 16,
        "{accepted} frames of 16 MiB read on six connections"
    );
    watching.abort();
    let all = peak.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "replica RSS: baseline {} MiB, peak {} MiB with one attacking connection, {} MiB with six",
        baseline / MIB,
        one / MIB,
        all / MIB
    );
    // The budget plus room for QUIC's receive windows and the 8 MiB write.
    ensure!(
        one <= baseline + 64 * MIB + 96 * MIB,
        "one connection: {} MiB",
        one / MIB
    );
    ensure!(
        all <= baseline + 256 * MIB + 96 * MIB,
        "six connections: {} MiB",
        all / MIB
    );
    // Still serving.
    let r = fe
        .get(
            "ad_profiles",
            Bytes::from_static(b"us/big"),
            &pangea_client::ReadOptions::default(),
        )
        .await?;
    ensure!(r.value.is_some());
    c.down(common::CLEANUP_GRACE_MS)?;
    Ok(())
}
