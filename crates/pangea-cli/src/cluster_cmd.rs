//! `pangea cluster up | down | status`: every replica of a topology as a local
//! process on 127.0.0.1, for development, drills on real processes and tests.

use anyhow::Result;
use clap::Subcommand;
use pangea_ops::local::{self, UpOptions, alive, cluster_path};
use pangea_topology::cluster::ClusterFile;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long `down` waits after SIGTERM before SIGKILL.
const GRACE_DEFAULT_MS: u64 = 10_000;

#[derive(Debug, Subcommand)]
pub(crate) enum ClusterCommand {
    /// Start every replica of TOPOLOGY as a local process; write DIR/cluster.toml.
    Up {
        topology: PathBuf,
        #[arg(long)]
        placement: Option<PathBuf>,
        #[arg(long)]
        data_dir: PathBuf,
        /// Delay traffic between replicas by the topology's latencies.
        #[arg(long)]
        emulate_wan: bool,
        /// fsync (default) or os-buffer.
        #[arg(long, default_value = "fsync")]
        durability: local::Durability,
        /// Let replicas take runtime faults on their admin endpoint (partitions,
        /// packet loss, clock offsets), for `pangea cluster nemesis`.
        #[arg(long)]
        fault_injection: bool,
    },
    /// Stop the cluster in DIR: SIGTERM, then SIGKILL after the grace period.
    Down {
        #[arg(long)]
        data_dir: PathBuf,
        #[arg(long, default_value_t = GRACE_DEFAULT_MS)]
        grace_ms: u64,
    },
    /// Stop some replicas of the cluster in DIR (SIGTERM, then SIGKILL after the
    /// grace period); the others keep running.
    Stop {
        #[arg(long)]
        data_dir: PathBuf,
        /// Replica ids (at least one; `cluster down` stops them all).
        #[arg(required = true)]
        replicas: Vec<String>,
        #[arg(long, default_value_t = GRACE_DEFAULT_MS)]
        grace_ms: u64,
    },
    /// Start replicas of the cluster in DIR that are not running, on their own
    /// addresses and data, and wait until they are healthy.
    Start {
        #[arg(long)]
        data_dir: PathBuf,
        /// Replica ids (none: every replica that is not running).
        replicas: Vec<String>,
    },
    /// Stop, then start, replicas of the cluster in DIR (none named: all, one by one).
    Restart {
        #[arg(long)]
        data_dir: PathBuf,
        replicas: Vec<String>,
        #[arg(long, default_value_t = GRACE_DEFAULT_MS)]
        grace_ms: u64,
    },
    /// Inject faults into a running cluster while checker workloads run, record a
    /// history and check it (C1, C4, C5, residency); see docs/reliability.md.
    Nemesis(crate::nemesis_cmd::NemesisArgs),
    /// Run the checkers on a history recorded by `nemesis`.
    CheckHistory(crate::nemesis_cmd::CheckArgs),
    /// Add processes to a running replica, or drain some, moving its shard
    /// groups between them under load (docs/sharding.md, "Resizing a replica").
    /// Run again after an interruption: it resumes from the step the cluster's
    /// topology file records.
    Resize {
        /// The cluster file (DIR/cluster.toml).
        #[arg(long)]
        cluster: PathBuf,
        /// The replica to resize.
        #[arg(long)]
        replica: String,
        /// How many processes it should run.
        #[arg(long)]
        processes: u32,
        /// Longest wait for the copy step, and for the serve step to drain (like
        /// 10m, 90s).
        #[arg(long, default_value = "10m")]
        step_limit: String,
        /// Least time the new layout serves before the old hosts let go, for
        /// clients to take up the new files.
        #[arg(long, default_value = "3s")]
        serve_min: String,
    },
    /// Process and health of every replica.
    Status {
        #[arg(long, conflicts_with = "cluster")]
        data_dir: Option<PathBuf>,
        #[arg(long)]
        cluster: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

pub(crate) fn run(cmd: ClusterCommand) -> Result<()> {
    match cmd {
        ClusterCommand::Up {
            topology,
            placement,
            data_dir,
            emulate_wan,
            durability,
            fault_injection,
        } => {
            let cluster = local::up(&UpOptions {
                binary: crate::pangea_binary()?,
                topology,
                placement,
                data_dir,
                emulate_wan,
                durability,
                fault_injection,
            })?;
            println!(
                "cluster {:?} is up: {} replicas",
                cluster.name,
                cluster.replicas.len()
            );
            println!(
                "  cluster file: {}",
                cluster_path(&cluster_dir(&cluster)).display()
            );
            Ok(())
        }
        ClusterCommand::Down { data_dir, grace_ms } => {
            down(&data_dir, Duration::from_millis(grace_ms))
        }
        ClusterCommand::Stop {
            data_dir,
            replicas,
            grace_ms,
        } => stop(&data_dir, &replicas, Duration::from_millis(grace_ms)),
        ClusterCommand::Start { data_dir, replicas } => start(&data_dir, &replicas),
        ClusterCommand::Restart {
            data_dir,
            replicas,
            grace_ms,
        } => {
            let ids = match replicas.is_empty() {
                true => ClusterFile::load(&cluster_path(&data_dir))
                    .map_err(anyhow::Error::msg)?
                    .replicas
                    .iter()
                    .map(|r| r.id.clone())
                    .collect(),
                false => replicas,
            };
            // One at a time: the others keep serving.
            for id in &ids {
                stop(
                    &data_dir,
                    std::slice::from_ref(id),
                    Duration::from_millis(grace_ms),
                )?;
                start(&data_dir, std::slice::from_ref(id))?;
            }
            Ok(())
        }
        ClusterCommand::Nemesis(a) => crate::nemesis_cmd::nemesis(a),
        ClusterCommand::CheckHistory(a) => crate::nemesis_cmd::check_history(a),
        ClusterCommand::Resize {
            cluster,
            replica,
            processes,
            step_limit,
            serve_min,
        } => pangea_ops::resize::run(
            &pangea_ops::resize::Options {
                cluster,
                replica,
                processes,
                binary: crate::pangea_binary()?,
                step_limit: crate::parse_duration(&step_limit)?,
                serve_min: crate::parse_duration(&serve_min)?,
            },
            &mut |line| println!("{line}"),
        ),
        ClusterCommand::Status {
            data_dir,
            cluster,
            json,
        } => {
            let path = match (data_dir, cluster) {
                (Some(d), _) => cluster_path(&d),
                (None, Some(c)) => c,
                (None, None) => anyhow::bail!("say --data-dir DIR or --cluster FILE"),
            };
            status(&path, json)
        }
    }
}

fn cluster_dir(c: &ClusterFile) -> PathBuf {
    c.topology
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// `cluster down`, with what it did printed.
fn down(dir: &Path, grace: Duration) -> Result<()> {
    let s = local::down(dir, grace)?;
    for id in &s.killed {
        eprintln!("replica {id} did not stop within {grace:?}: SIGKILL");
    }
    println!(
        "cluster {:?} stopped: {} replicas ({} killed after the grace period)",
        s.cluster,
        s.replicas,
        s.killed.len()
    );
    Ok(())
}

/// `cluster stop`, with what it did printed.
fn stop(dir: &Path, ids: &[String], grace: Duration) -> Result<()> {
    for id in local::stop(dir, ids, grace)? {
        eprintln!("replica {id} did not stop within {grace:?}: SIGKILL");
    }
    for id in ids {
        println!("stopped replica {id}");
    }
    Ok(())
}

/// `cluster start`: replicas started, their readiness phases shown as they come.
pub(crate) fn start(dir: &Path, ids: &[String]) -> Result<()> {
    let started = local::start(&crate::pangea_binary()?, dir, ids, &mut |id, phase| {
        println!("  {id}: {phase}")
    })?;
    for r in &started {
        println!("started replica {} ({})", r.id, r.region);
    }
    Ok(())
}

fn status(path: &Path, json: bool) -> Result<()> {
    let cluster = ClusterFile::load(path).map_err(anyhow::Error::msg)?;
    let mut rows = Vec::new();
    for r in &cluster.replicas {
        let running = r.pid.is_some_and(alive);
        let healthy = running
            && pangea_ops::admin::Admin::new(&r.admin)
                .and_then(|a| a.health())
                .is_ok_and(|(ok, _)| ok);
        rows.push(serde_json::json!({
            "id": r.id, "region": r.region, "address": r.address, "admin": r.admin,
            "pid": r.pid, "running": running, "healthy": healthy,
        }));
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!("cluster {:?} ({})", cluster.name, path.display());
    println!(
        "{:<14} {:<16} {:<22} {:<22} {:>8} {:>8}",
        "REPLICA", "REGION", "ADDRESS", "ADMIN", "PID", "STATE"
    );
    for (r, row) in cluster.replicas.iter().zip(&rows) {
        let state = match (row["running"].as_bool(), row["healthy"].as_bool()) {
            (Some(true), Some(true)) => "healthy",
            (Some(true), _) => "unhealthy",
            _ => "stopped",
        };
        println!(
            "{:<14} {:<16} {:<22} {:<22} {:>8} {:>8}",
            r.id,
            r.region,
            r.address,
            r.admin,
            r.pid.map_or("-".into(), |p| p.to_string()),
            state
        );
    }
    Ok(())
}
