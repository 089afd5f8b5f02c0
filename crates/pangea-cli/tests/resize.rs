//! Resizing a running replica (docs/sharding.md, "Resizing a replica"): `pangea
//! cluster nemesis --faults resize` grows a replica of the two-region cluster of
//! 8 shard groups by two processes under the checker workloads, SIGKILLs the
//! mover once while it waits in a step and runs it again to finish, then drains
//! the replica back by one process. No operation fails (reads and writes), the
//! history checkers find no violation (no acknowledged write lost, none of a
//! process's sequences used twice, every replica converged), and afterwards
//! each process of the replica replicates exactly the groups the new layout
//! gives it and has purged the rows of those it gave up.

mod common;

use anyhow::{Context, Result, ensure};
use common::Cluster;
use pangea_topology::shard::{GroupId, process_of};
use std::collections::BTreeSet;

#[test]
fn a_replica_grows_and_drains_under_load_with_its_mover_killed_and_resumed() -> Result<()> {
    let mut cluster = Cluster::up_with_faults_of(
        "crates/pangea-cli/tests/data/sharded-processes.toml",
        "crates/pangea-cli/tests/data/sharded.placement.toml",
    )?;
    let (stdout, _history) = common::nemesis(
        &cluster,
        &[
            "--faults",
            "resize",
            // One resize (two moves) and the start of a second fit.
            "--duration",
            "12s",
            "--calm-ms",
            "1000",
            "--seed",
            "3",
        ],
    )?;
    ensure!(stdout.contains("] resize start"), "{stdout}");
    ensure!(stdout.contains("mover SIGKILLed in its"), "{stdout}");
    ensure!(stdout.contains("resuming the resize"), "{stdout}");
    ensure!(stdout.contains("violations: 0"), "{stdout}");
    // Every operation succeeded, reads included, and each kind did real work.
    for line in [
        "register write",
        "register read",
        "ryw write",
        "ryw read",
        "set write",
    ] {
        let counts: Vec<u64> = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(line))
            .with_context(|| format!("no {line:?} line in:\n{stdout}"))?
            .split(['/', ' '])
            .filter_map(|n| n.parse().ok())
            .collect();
        ensure!(
            counts.len() == 3 && counts[0] > 10 && counts[1] == 0 && counts[2] == 0,
            "{line}: ok / fail / unknown = {counts:?}:\n{stdout}"
        );
    }

    // The layout the runs left, as the cluster's files say it.
    cluster.reload()?;
    let files = pangea_topology::cluster::ClusterFile::load(&cluster.cluster_path())
        .map_err(anyhow::Error::msg)?;
    let d = pangea_topology::Deployment::load(&files.topology, files.placement.as_deref())
        .map_err(|p| anyhow::anyhow!("{p}"))?;
    let resized = stdout
        .lines()
        .find(|l| l.contains("] resize end"))
        .and_then(|l| l.split_whitespace().skip_while(|w| *w != "end").nth(1))
        .context("no resize end line")?
        .to_owned();
    let r = d
        .topology
        .replica(&resized)
        .with_context(|| format!("replica {resized} is gone"))?;
    ensure!(r.resize.is_none(), "the resize did not finish: {r:?}");
    let processes = r.processes;
    let ids: Vec<String> = cluster_ids(&files, &resized);
    ensure!(
        ids.len() == processes as usize,
        "the cluster runs {ids:?}, the topology says {processes} processes"
    );
    // Each process replicates the groups the layout gives it (and the system
    // scope), nothing else: the old hosts let go of the moved groups.
    for (index, id) in ids.iter().enumerate() {
        let (code, body) = cluster.admin_get(id, "/watermarks")?;
        ensure!(code == 200, "{id}: /watermarks answered {code}");
        let w: serde_json::Value = serde_json::from_str(&body)?;
        let scopes: BTreeSet<String> = w["scopes"]
            .as_array()
            .context("scopes")?
            .iter()
            .filter_map(|s| s["scope"].as_str().map(str::to_owned))
            .collect();
        let want: BTreeSet<String> = (0..8)
            .filter(|g| *g == 0 || process_of(8, processes, GroupId(*g)) as usize == index)
            .map(|g| format!("global/{g}"))
            .collect();
        ensure!(scopes == want, "{id} replicates {scopes:?}, not {want:?}");
    }
    // And purged the rows of the groups it gave up.
    let logs: String = ids.iter().map(|id| cluster.log_tail(id, 10_000)).collect();
    ensure!(
        logs.contains("rows of shard groups this process no longer hosts (resize)"),
        "no process of {resized} purged moved rows"
    );
    Ok(())
}

/// The processes of `replica` the cluster file lists, in index order.
fn cluster_ids(files: &pangea_topology::cluster::ClusterFile, replica: &str) -> Vec<String> {
    let mut ids: Vec<(u32, String)> = files
        .replicas
        .iter()
        .filter_map(|r| {
            let index = match r.id.strip_prefix(replica)? {
                "" => 0,
                rest => rest.strip_prefix(".p")?.parse().ok()?,
            };
            Some((index, r.id.clone()))
        })
        .collect();
    ids.sort();
    ids.into_iter().map(|(_, id)| id).collect()
}
