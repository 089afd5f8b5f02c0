//! `pangea sim calibrate`: flags for `pangea_ops::calibrate`, and its report.

use crate::parse_duration;
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub(crate) struct CalibrateArgs {
    #[arg(long, default_value = "topology/local-3-regions.toml")]
    topology: PathBuf,
    #[arg(long, default_value = "topology/local-3-regions.placement.toml")]
    placement: PathBuf,
    /// How long each run lasts (virtual time in the simulator, wall time live).
    #[arg(long, default_value = "30s")]
    duration: String,
    /// Operations per second over all regions (spread by serving replicas).
    #[arg(long, default_value_t = 300.0)]
    rate: f64,
    /// Frontends per region (each its own client state).
    #[arg(long, default_value_t = 2)]
    clients_per_region: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where the live cluster lives (default: a fresh temporary directory).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Write both runs and the comparison as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub(crate) fn run(a: CalibrateArgs) -> Result<()> {
    let report = pangea_ops::calibrate::run(
        &pangea_ops::calibrate::Options {
            topology: a.topology,
            placement: a.placement,
            duration: parse_duration(&a.duration)?,
            rate: a.rate,
            clients_per_region: a.clients_per_region,
            seed: a.seed,
            data_dir: a.data_dir,
            binary: crate::pangea_binary()?,
        },
        &mut |line| println!("{line}"),
    )?;
    println!("\n{report}");
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
