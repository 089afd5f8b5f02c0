//! An empty store is not evidence that nothing exists (docs/operations.md,
//! "Readiness"): a new replica of a running cluster that hears no peer stays
//! not-ready, visibly, while clients read elsewhere; it serves once it has caught
//! up. A replica created with a new cluster trusts its empty store.

mod common;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use common::{Cluster, US, eventually, http_post};
use pangea_client::{Consistency, ReadOptions};
use std::time::Duration;

const LONELY: &str = "use1-b";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_replica_that_hears_no_peer_never_serves_emptiness() -> Result<()> {
    let mut c = Cluster::up_with_faults(false)?;
    let fe = c.client(US, "frontend").await?;
    let keys: Vec<String> = (0..40).map(|i| format!("us/{i:03}")).collect();
    for k in &keys {
        let m = common::profile_set(k.clone(), &b"v"[..])?;
        fe.mutate(m, &common::setup_writes()).await?;
    }
    // An acknowledged write is durable at the replica that took it, not yet on
    // every other: before use1-b loses its disk, the others must hold all it has.
    let lonely_admin = c.replica(LONELY)?.admin.clone();
    let scopes: Vec<String> = pangea_ops::admin::Admin::new(&lonely_admin)?
        .watermarks()?
        .scopes
        .into_iter()
        .map(|s| s.scope)
        .collect();
    let mut need = Vec::new();
    for scope in scopes {
        need.push((
            scope.clone(),
            common::admin_watermarks(&lonely_admin, &scope)?,
        ));
    }
    let others: Vec<String> = c.ids().into_iter().filter(|id| id != LONELY).collect();
    eventually(
        Duration::from_secs(10),
        Duration::from_millis(20),
        "every write reached the other replicas",
        || async {
            for id in &others {
                let admin = &c.replica(id)?.admin;
                for (scope, origins) in &need {
                    let have = common::admin_watermarks(admin, scope)?;
                    // A replica outside the scope's regions holds none of it.
                    if have.is_empty() {
                        continue;
                    }
                    if origins
                        .iter()
                        .any(|(o, seq)| have.get(o).copied().unwrap_or(0) < *seq)
                    {
                        return Ok(None);
                    }
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    // use1-b is replaced by a new, empty replica of the same id, which no peer can
    // reach: every other replica drops what it sends there.
    c.kill9(LONELY)?;
    let data = c.replica(LONELY)?.data_dir.clone();
    std::fs::remove_dir_all(&data)?;
    for id in c.ids().into_iter().filter(|id| id != LONELY) {
        let admin = c.replica(&id)?.admin.clone();
        let (code, body) = http_post(
            &admin,
            &format!("/fault/link?peers={LONELY}&partitioned=true"),
        )?;
        ensure!(code == 200, "{id}: {code} {body}");
    }
    c.restart(LONELY)?;
    // Well past the 3 s a replica once waited before serving an empty store.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (code, body) = c.admin_get(LONELY, "/health")?;
    ensure!(
        code == 503 && body.contains("waiting to hear a peer of global"),
        "{code} {body}"
    );
    // Reads go elsewhere: every key is found, none by the lonely replica.
    let opts = ReadOptions::default().with_deadline(Duration::from_secs(2));
    for k in &keys {
        for consistency in [Consistency::Eventual, Consistency::RowAffinity] {
            let r = fe
                .get(
                    "ad_profiles",
                    Bytes::from(k.clone()),
                    &ReadOptions {
                        consistency: consistency.clone(),
                        ..opts.clone()
                    },
                )
                .await
                .with_context(|| format!("{k} {consistency:?}"))?;
            ensure!(r.value.is_some(), "{k}: not found, from {}", r.replica);
            ensure!(
                r.replica.as_str() != LONELY,
                "{k} served by the lonely replica"
            );
        }
    }
    // Healed: it hears its peers, catches up, and serves what exists.
    for id in c.ids().into_iter().filter(|id| id != LONELY) {
        let admin = c.replica(&id)?.admin.clone();
        http_post(&admin, "/fault/heal")?;
    }
    eventually(
        Duration::from_secs(30),
        Duration::from_millis(200),
        "the new replica is ready",
        || async { Ok((c.admin_get(LONELY, "/health")?.0 == 200).then_some(())) },
    )
    .await?;
    ensure!(
        std::fs::read_to_string(data.join("readiness"))?.trim() == "caught-up",
        "the replica did not record that it caught up"
    );
    c.down(common::CLEANUP_GRACE_MS)?;
    Ok(())
}

/// A replica created with a new cluster (`--new-cluster`, as `pangea cluster up`
/// passes on a fresh directory) trusts its empty store even alone; the same
/// replica started without it waits.
#[test]
fn a_replica_of_a_new_cluster_trusts_its_empty_store() -> Result<()> {
    let c = Cluster::up(false)?;
    c.down(common::CLEANUP_GRACE_MS)?;
    let r = c.replica("euw1-a")?.clone();
    for (new_cluster, want) in [(false, 503), (true, 200)] {
        let dir = tempfile::tempdir()?;
        let admin = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .to_string();
        let mut args = vec![
            "start".to_owned(),
            "--topology".into(),
            c.file.topology.display().to_string(),
            "--replica".into(),
            r.id.clone(),
            "--data-dir".into(),
            dir.path().display().to_string(),
            "--certs".into(),
            c.file.certs.display().to_string(),
            "--admin".into(),
            admin.clone(),
        ];
        if let Some(p) = &c.file.placement {
            args.extend(["--placement".into(), p.display().to_string()]);
        }
        if new_cluster {
            args.push("--new-cluster".into());
        }
        let mut child = std::process::Command::new(common::PANGEA)
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        std::thread::sleep(Duration::from_secs(5));
        let health = common::http_get(&admin, "/health");
        let _ = child.kill();
        let _ = child.wait();
        let (code, body) = health?;
        ensure!(code == want, "new_cluster={new_cluster}: {code} {body}");
    }
    Ok(())
}
