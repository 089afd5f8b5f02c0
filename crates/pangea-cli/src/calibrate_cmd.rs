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
    /// Operations per second over all regions (spread by serving replicas); several,
    /// comma-separated, run one after the other, each on a fresh live cluster, with
    /// the host costs fitted at the first two (the model must predict the others).
    #[arg(long, default_value = "300", value_delimiter = ',')]
    rate: Vec<f64>,
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
    let duration = parse_duration(&a.duration)?;
    let binary = crate::pangea_binary()?;
    let options = |rate: f64| pangea_ops::calibrate::Options {
        topology: a.topology.clone(),
        placement: a.placement.clone(),
        duration,
        rate,
        clients_per_region: a.clients_per_region,
        seed: a.seed,
        data_dir: a.data_dir.clone(),
        binary: binary.clone(),
        fitted: None,
    };
    let mut say = |line: &str| println!("{line}");
    let mut measured = Vec::new();
    for &rate in &a.rate {
        measured.push((
            rate,
            pangea_ops::calibrate::measure(&options(rate), &mut say)?,
        ));
    }
    let levels: Vec<&pangea_ops::calibrate::Measured> = measured.iter().map(|(_, m)| m).collect();
    let fit = pangea_ops::calibrate::fit_levels(&levels)?;
    let mut reports = Vec::new();
    for (rate, m) in measured {
        let report = pangea_ops::calibrate::finish(&options(rate), m, fit, &mut say)?;
        println!("\n{report}");
        reports.push(report);
    }
    if reports.len() > 1 {
        println!(
            "\nAcross load levels (host costs fitted at {} ops/s):",
            a.rate[0]
        );
        for r in &reports {
            println!("  {}", r.agreement());
        }
    }
    if let Some(path) = &a.json {
        let json = match reports.as_slice() {
            [one] => serde_json::to_vec_pretty(one)?,
            all => serde_json::to_vec_pretty(all)?,
        };
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
