//! `pangea cluster nemesis` and `pangea cluster check-history`: the flags of
//! `pangea_ops::nemesis` and its report, printed.

use anyhow::Result;
use clap::Args;
use pangea_ops::nemesis::{self, check};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Args)]
pub(crate) struct NemesisArgs {
    /// The cluster file (`pangea cluster up --fault-injection` writes DIR/cluster.toml).
    #[arg(long)]
    cluster: PathBuf,
    /// Faults to inject, comma-separated: kill, pause, partition, loss, skew,
    /// restart-region, disk-full, flood, new-replica, resize (not among the
    /// defaults: it grows a replica for good).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kill,pause,partition,loss,skew,restart-region,disk-full,flood,new-replica"
    )]
    faults: Vec<String>,
    /// Workloads, comma-separated: register, ryw, set, changes (a change-stream
    /// consumer per region; the table needs a change stream), backup (full
    /// backups every 3 s, read back after the heal).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "register,ryw,set,changes,backup"
    )]
    workloads: Vec<String>,
    /// How long to inject faults (like 60s, 5m).
    #[arg(long, default_value = "60s")]
    duration: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where to write the history (default: nemesis-SEED.jsonl next to the cluster file).
    #[arg(long)]
    history: Option<PathBuf>,
    /// How long each fault lasts.
    #[arg(long, default_value_t = 4_000)]
    fault_ms: u64,
    /// Quiet time between faults.
    #[arg(long, default_value_t = 2_000)]
    calm_ms: u64,
    /// Longest wait for replicas to converge after the heal (C5).
    #[arg(long, default_value_t = 60_000)]
    converge_limit_ms: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) fn nemesis(a: NemesisArgs) -> Result<()> {
    let o = nemesis::Options {
        cluster: a.cluster,
        faults: a.faults,
        workloads: a.workloads,
        duration: crate::parse_duration(&a.duration)?,
        seed: a.seed,
        history: a.history,
        fault: Duration::from_millis(a.fault_ms),
        calm: Duration::from_millis(a.calm_ms),
        converge_limit: Duration::from_millis(a.converge_limit_ms),
        binary: crate::pangea_binary()?,
    };
    let (report, history) = nemesis::run(&o, Box::new(|line| println!("{line}")))?;
    print_report(&report, a.json, &history)
}

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// A history written by `pangea cluster nemesis`.
    history: PathBuf,
    #[arg(long)]
    json: bool,
}

pub(crate) fn check_history(a: CheckArgs) -> Result<()> {
    let report = nemesis::check_history(&a.history)?;
    print_report(&report, a.json, &a.history)
}

fn print_report(r: &check::Report, json: bool, path: &Path) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(r)?);
    } else {
        println!("history {}", path.display());
        println!("  operations (ok / fail / unknown):");
        for (what, c) in &r.ops {
            println!("    {what:<16} {:>7} / {:>5} / {:>5}", c.ok, c.fail, c.info);
        }
        let faults: Vec<String> = r.faults.iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!("  faults injected: {}", faults.join(", "));
        println!("  change streams: {} changes seen", r.changes_seen);
        println!(
            "  backups: {} taken, {} failed, {} replica failovers",
            r.backups.taken, r.backups.failed, r.backups.failovers
        );
        match r.convergence_ms {
            Some(ms) => println!("  converged {ms} ms after the heal"),
            None => println!("  did not converge"),
        }
        println!("  violations: {}", r.violations.len());
        for v in &r.violations {
            println!("    [{}] {} (ops {:?})", v.checker, v.message, v.ops);
        }
    }
    anyhow::ensure!(
        r.violations.is_empty(),
        "{} violation(s) in {}",
        r.violations.len(),
        path.display()
    );
    Ok(())
}
