//! `pangea placement move | status | audit`: placement changes on a running cluster
//! and the residency audit (docs/placement.md).

use crate::data_cmd::Connect;
use crate::output::parse_key;
use anyhow::Result;
use clap::{Args, Subcommand};
use pangea_topology::cluster::ClusterFile;
use std::io::Write;
use std::time::{Duration, Instant};

#[derive(Debug, Subcommand)]
pub(crate) enum PlacementCommand {
    /// Move the rows of a table under a key prefix to another placement policy, in
    /// the background with no downtime; shows progress until done.
    Move(MoveArgs),
    /// Every migration job: phase and progress.
    Status {
        #[command(flatten)]
        connect: Connect,
    },
    /// Every replica's rows its placement does not allow, and restricted frames on
    /// links outside their policy. Exits non-zero on any violation.
    Audit {
        #[command(flatten)]
        connect: Connect,
    },
}

#[derive(Debug, Args)]
pub(crate) struct MoveArgs {
    #[command(flatten)]
    connect: Connect,
    /// Row-key prefix (text, or 0x and hex).
    #[arg(long)]
    prefix: String,
    /// The placement policy to move to.
    #[arg(long)]
    to: String,
    /// A new home region (inside the new policy).
    #[arg(long)]
    home: Option<String>,
    /// Return once the job has started.
    #[arg(long)]
    no_wait: bool,
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

pub(crate) fn run(cmd: PlacementCommand) -> Result<()> {
    runtime()?.block_on(async move {
        match cmd {
            PlacementCommand::Move(a) => {
                let client = a.connect.operator_client().await?;
                let prefix = parse_key(&a.prefix)?;
                let (runner, job) = client.placement_move(&a.connect.table, &prefix, &a.to, a.home.as_deref()).await?;
                println!("job {job} started on {runner}");
                if a.no_wait {
                    return Ok(());
                }
                let started = Instant::now();
                loop {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    let Some(j) = client.jobs().await?.into_iter().find(|j| j.id == job) else { continue };
                    let total = j.rows_total.max(j.rows_copied).max(1);
                    let width = 30;
                    let filled = (j.rows_copied * width / total) as usize;
                    print!(
                        "\r  {:<10} [{}{}] {}/{} rows  {:.1} s   ",
                        j.phase,
                        "#".repeat(filled),
                        " ".repeat(width as usize - filled),
                        j.rows_copied,
                        j.rows_total,
                        started.elapsed().as_secs_f64()
                    );
                    let _ = std::io::stdout().flush();
                    match j.phase.as_str() {
                        "done" => {
                            println!("\nrows of {} under {:?} are now in policy {} (from {})", j.table, a.prefix, j.to_policy, j.from_policy);
                            return Ok(());
                        }
                        "failed" => {
                            println!();
                            anyhow::bail!("job {job} failed: {}", j.error);
                        }
                        _ => {}
                    }
                }
            }
            PlacementCommand::Status { connect } => {
                let client = connect.operator_client().await?;
                let jobs = client.jobs().await?;
                if connect.json {
                    let v: Vec<serde_json::Value> = jobs
                        .iter()
                        .map(|j| {
                            serde_json::json!({
                                "id": j.id, "table": j.table, "prefix": String::from_utf8_lossy(&j.prefix),
                                "from": j.from_policy, "to": j.to_policy, "runner": j.runner, "phase": j.phase,
                                "rows_copied": j.rows_copied, "rows_total": j.rows_total, "error": j.error,
                            })
                        })
                        .collect();
                    println!("{}", serde_json::to_string_pretty(&v)?);
                } else {
                    println!("{:<40} {:<12} {:<14} {:<14} {:<10} {:>14}", "JOB", "PREFIX", "FROM", "TO", "PHASE", "ROWS");
                    for j in jobs {
                        println!(
                            "{:<40} {:<12} {:<14} {:<14} {:<10} {:>7}/{:<7}",
                            j.id,
                            String::from_utf8_lossy(&j.prefix),
                            j.from_policy,
                            j.to_policy,
                            j.phase,
                            j.rows_copied,
                            j.rows_total
                        );
                    }
                }
                Ok(())
            }
            PlacementCommand::Audit { connect } => {
                let client = connect.operator_client().await?;
                let cluster = ClusterFile::load(&connect.cluster).map_err(anyhow::Error::msg)?;
                let mut violations = 0u64;
                let mut reports = Vec::new();
                for r in &cluster.replicas {
                    let a = client.audit(&r.id.as_str().into()).await?;
                    let disallowed: u64 = a.tables.iter().map(|t| t.rows_disallowed).sum();
                    violations += disallowed + a.restricted_frames_to_outsiders + a.restricted_frames_from_outsiders;
                    reports.push(serde_json::json!({
                        "replica": a.replica, "region": a.region,
                        "rows": a.tables.iter().map(|t| t.rows).sum::<u64>(),
                        "rows_disallowed": disallowed,
                        "bytes_disallowed": a.tables.iter().map(|t| t.bytes_disallowed).sum::<u64>(),
                        "restricted_frames_to_outsiders": a.restricted_frames_to_outsiders,
                        "restricted_frames_from_outsiders": a.restricted_frames_from_outsiders,
                    }));
                }
                if connect.json {
                    println!("{}", serde_json::to_string_pretty(&serde_json::json!({"violations": violations, "replicas": reports}))?);
                } else {
                    println!("{:<14} {:<16} {:>10} {:>16} {:>14} {:>14}", "REPLICA", "REGION", "ROWS", "ROWS DISALLOWED", "FRAMES OUT", "FRAMES IN");
                    for r in &reports {
                        println!(
                            "{:<14} {:<16} {:>10} {:>16} {:>14} {:>14}",
                            r["replica"].as_str().unwrap_or(""),
                            r["region"].as_str().unwrap_or(""),
                            r["rows"],
                            r["rows_disallowed"],
                            r["restricted_frames_to_outsiders"],
                            r["restricted_frames_from_outsiders"]
                        );
                    }
                    println!("{violations} violation(s)");
                }
                anyhow::ensure!(violations == 0, "residency audit found {violations} violation(s)");
                Ok(())
            }
        }
    })
}
