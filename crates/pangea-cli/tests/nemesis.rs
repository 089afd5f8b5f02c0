//! `pangea cluster nemesis` on a live local cluster: a short run injecting every
//! fault while the three checker workloads run finds no violation, and
//! `pangea cluster check-history` re-checks the recorded history and catches one
//! that was tampered with. The 60-second matrix of docs/reliability.md runs the same
//! command for longer.

mod common;

use anyhow::{Context, Result, ensure};
use common::{Cluster, pangea};
use std::time::Duration;

#[test]
fn a_short_nemesis_run_with_every_fault_finds_no_violation_and_its_history_rechecks() -> Result<()>
{
    let cluster = Cluster::up_with_faults(false)?;
    let cluster_path = cluster.cluster_path();
    let history = cluster.dir.path().join("history.jsonl");
    let out = pangea(
        &[
            "cluster",
            "nemesis",
            "--cluster",
            cluster_path.to_str().context("path")?,
            // Nine faults of 1.5 s, 1 s of calm after each and restarts of a few
            // seconds fit with room to spare for a slow machine.
            "--duration",
            "54s",
            "--fault-ms",
            "1500",
            "--calm-ms",
            "1000",
            "--seed",
            "7",
            "--history",
            history.to_str().context("path")?,
        ],
        Duration::from_secs(300),
    )?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "nemesis failed:\n{stdout}\n{stderr}");
    // Every fault the nemesis injects by default (all but `resize`, which grows a
    // replica for good: tests/resize.rs).
    for fault in pangea_ops::nemesis::FAULTS
        .iter()
        .filter(|f| **f != "resize")
    {
        ensure!(
            stdout.contains(&format!("] {fault} start")),
            "fault {fault} was not injected:\n{stdout}"
        );
    }
    ensure!(stdout.contains("violations: 0"), "{stdout}");
    // Every workload did acknowledged work and answered reads.
    for line in [
        "register write",
        "register read",
        "ryw write",
        "ryw read",
        "set write",
    ] {
        let ok: u64 = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(line))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("no {line:?} line in:\n{stdout}"))?;
        ensure!(
            ok > 10,
            "only {ok} acknowledged {line} operations:\n{stdout}"
        );
    }

    // The history alone gives the same verdict.
    let path = history.to_str().context("path")?;
    let out = pangea(&["cluster", "check-history", path], Duration::from_secs(60))?;
    ensure!(
        out.status.success(),
        "check-history failed on a clean history: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Drop one acknowledged set member from a replica's final state: C1 says which.
    let text = std::fs::read_to_string(&history)?;
    let mut tampered = Vec::new();
    let mut dropped = None;
    for line in text.lines() {
        let mut v: serde_json::Value = serde_json::from_str(line)?;
        let replica = v["replica"].as_str().unwrap_or("").to_owned();
        if dropped.is_none()
            && v["type"] == "final"
            && v["prefix"].as_str().is_some_and(|p| p.starts_with("set/"))
            && let Some(rows) = v["rows"].as_array_mut()
            && !rows.is_empty()
        {
            dropped = Some((replica, rows.remove(0)));
        }
        tampered.push(v.to_string());
    }
    let (replica, row) = dropped.context("no set/ final state with rows in the history")?;
    let bad = cluster.dir.path().join("tampered.jsonl");
    std::fs::write(&bad, tampered.join("\n"))?;
    let out = pangea(
        &["cluster", "check-history", bad.to_str().context("path")?],
        Duration::from_secs(60),
    )?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        !out.status.success(),
        "a tampered history passed:\n{stdout}"
    );
    let key = row["key"].as_str().unwrap_or("");
    ensure!(
        stdout.contains("[C1]") && stdout.contains(key) && stdout.contains(&replica),
        "C1 did not name {key} on {replica}:\n{stdout}"
    );
    Ok(())
}
