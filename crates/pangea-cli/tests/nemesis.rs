//! `pangea cluster nemesis` on a live local cluster: a short run injecting every
//! fault while the checker workloads run (change-stream consumers and backups
//! among them) finds no violation, and
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
    let (stdout, history) = common::nemesis(
        &cluster,
        &[
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
        ],
    )?;
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

    // The change-stream consumers read changes; backups were taken and held
    // their cuts (C9 and C10 are among the violations counted above).
    let count = |prefix: &str| -> Result<u64> {
        stdout
            .lines()
            .find_map(|l| l.trim_start().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("no {prefix:?} line in:\n{stdout}"))
    };
    ensure!(count("change streams:")? > 100, "{stdout}");
    ensure!(count("backups:")? >= 3, "{stdout}");

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

/// A backup during a region loss (issue 38 point 4): the `backup` workload
/// backs up from ap-northeast-1 while `restart-region` kills that region's
/// replicas (seed 3 picks it first); a backup that overlaps the loss fails
/// over to a replica of another region and completes, and every backup holds
/// its cut (C10), every change stream every write (C9).
#[test]
fn a_backup_through_the_loss_of_its_region_completes_and_holds_its_cut() -> Result<()> {
    let cluster = Cluster::up_with_faults(false)?;
    let (stdout, history) = common::nemesis(
        &cluster,
        &[
            "--faults",
            "restart-region",
            "--workloads",
            "set,changes,backup",
            "--duration",
            "10s",
            "--fault-ms",
            "4000",
            "--calm-ms",
            "1000",
            "--seed",
            "3",
        ],
    )?;
    ensure!(stdout.contains("violations: 0"), "{stdout}");
    // Losses of the backing-up region, and the backups that ran through one.
    let events: Vec<serde_json::Value> = std::fs::read_to_string(&history)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let mut losses = Vec::new();
    let mut began = None;
    for e in &events {
        if e["type"] == "fault" && e["targets"].to_string().contains("apne1") {
            let at = e["at_us"].as_u64().unwrap_or(0);
            match e["phase"].as_str() {
                Some("start") => began = Some(at),
                _ => losses.extend(began.take().map(|b| (b, at))),
            }
        }
    }
    ensure!(
        !losses.is_empty(),
        "ap-northeast-1 was never lost:\n{stdout}"
    );
    let through: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["type"] == "backup" && e["ok"] == true)
        .filter(|e| {
            let (s, t) = (
                e["start_us"].as_u64().unwrap_or(0),
                e["end_us"].as_u64().unwrap_or(0),
            );
            losses.iter().any(|(b, f)| s < *f && t > *b)
        })
        .collect();
    ensure!(
        !through.is_empty(),
        "no backup completed during a loss of its region {losses:?}:\n{stdout}"
    );
    println!(
        "{} backups completed while ap-northeast-1 was down ({} replica failovers)",
        through.len(),
        through
            .iter()
            .map(|e| e["failovers"].as_u64().unwrap_or(0))
            .sum::<u64>()
    );
    Ok(())
}
