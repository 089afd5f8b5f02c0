//! `pangea sim calibrate`: flags for `pangea_ops::calibrate`, and its report.

use crate::parse_duration;
use anyhow::{Context, Result};
use clap::Args;
use pangea_ops::calibrate::{
    self, Calibration, Fit, KILL_WINDOW, Kill, Measured, Options, Recording, Report,
};
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
    /// Also run one level with this replica killed (SIGKILL live; simulated as a
    /// crashed process and as a silent host), and compare the errors, hedges and
    /// failovers of the 10 s after the kill.
    #[arg(long)]
    kill: Option<String>,
    /// When the kill comes, from the start of its run (which lasts at least
    /// until 10 s after it).
    #[arg(long, default_value = "10s")]
    kill_at: String,
    /// The load of the kill's run (default: the middle of the `--rate` levels).
    #[arg(long)]
    kill_rate: Option<f64>,
    /// Also search the load at which the live cluster, and the fitted model,
    /// stop meeting p99 ≤ 20 ms with ≤ 0.1 % failed reads, from the last
    /// `--rate` level up (×1.5 a step, then bisected).
    #[arg(long)]
    saturate: bool,
    /// How long each saturation step lasts.
    #[arg(long, default_value = "10s")]
    step: String,
    /// Bisection steps of the saturation search (with `--replay`: the recorded
    /// search's, or this for a recording that does not say).
    #[arg(long, default_value_t = 2)]
    bisect: u32,
    /// Write every run and comparison as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run no live cluster: compare with the live figures of an earlier `--json`
    /// (its levels and kill, with its files, rates, durations, seeds and
    /// frontends; its saturation search's live steps, against the simulator's
    /// searched again), to try a change of the model on the same live runs.
    #[arg(long, conflicts_with_all = [
        "topology", "placement", "rate", "clients_per_region", "kill", "saturate",
        "duration", "seed",
    ])]
    replay: Option<PathBuf>,
}

pub(crate) fn run(a: CalibrateArgs) -> Result<()> {
    if let Some(path) = &a.replay {
        return replay(&a, path);
    }
    // The live frontends measure latency in this process: no stalls clearing huge
    // pages, as the demo's and the load generators' (`no_huge_pages`).
    crate::no_huge_pages();
    let duration = parse_duration(&a.duration)?;
    let kill = match &a.kill {
        Some(replica) => Some(Kill {
            replica: replica.clone(),
            at: parse_duration(&a.kill_at).context("--kill-at")?,
        }),
        None => None,
    };
    let step = parse_duration(&a.step).context("--step")?;
    anyhow::ensure!(!a.rate.is_empty(), "--rate: give at least one load level");
    let binary = crate::pangea_binary()?;
    let options = |rate: f64| Options {
        topology: a.topology.clone(),
        placement: a.placement.clone(),
        duration,
        rate,
        clients_per_region: a.clients_per_region,
        seed: a.seed,
        data_dir: a.data_dir.clone(),
        binary: binary.clone(),
        fitted: None,
        kill: None,
    };
    let mut say = |line: &str| println!("{line}");
    let mut measured = Vec::new();
    for &rate in &a.rate {
        let o = options(rate);
        let m = calibrate::measure(&o, &mut say)?;
        measured.push((o, m));
    }
    let fitted_at: Vec<String> = a.rate.iter().take(2).map(|r| r.to_string()).collect();
    let mut heading = format!(
        "host costs fitted at {} ops/s, the stalls' rate to {} ops/s's read p99.9",
        fitted_at.join(" and "),
        a.rate[0]
    );
    if let Some(third) = a.rate.get(2) {
        heading += &format!(", the wake-up's cost to {third} ops/s's read p99");
    }
    let (fit, levels) = calibrate::compare_levels(measured, &heading, &mut say)?;
    let kill = match kill {
        Some(k) => {
            let rate = a.kill_rate.unwrap_or(a.rate[a.rate.len() / 2]);
            let o = Options {
                duration: duration.max(k.at + KILL_WINDOW),
                kill: Some(k),
                ..options(rate)
            };
            let m = calibrate::measure(&o, &mut say)?;
            Some(compare_kill(&o, m, fit, &mut say)?)
        }
        None => None,
    };
    let saturation = if a.saturate {
        let from = a.rate[a.rate.len() - 1];
        let s = calibrate::saturation(&options(from), fit, step, a.bisect, &mut say)?;
        println!("\n{}", s.agreement());
        Some(s)
    } else {
        None
    };
    write_json(
        a.json.as_deref(),
        &Report {
            levels,
            kill,
            saturation,
        },
    )
}

/// `--replay`: the levels, the kill and the saturation search of an earlier
/// `--json` (its files, rates, durations, seeds and frontends), simulated again,
/// as shipped and then fitted, against its live figures.
fn replay(a: &CalibrateArgs, path: &std::path::Path) -> Result<()> {
    let recording = Recording::read(path)?;
    let mut say = |line: &str| println!("{line}");
    let mut measured = Vec::new();
    let mut levels_options = Vec::new();
    for (o, live) in recording.levels {
        let m = calibrate::replay(&o, live, &mut say)?;
        levels_options.push(o.clone());
        measured.push((o, m));
    }
    let heading = format!("replayed from {}", path.display());
    let (fit, levels) = calibrate::compare_levels(measured, &heading, &mut say)?;
    let kill = match recording.kill {
        Some((o, live)) => {
            let m = calibrate::replay(&o, live, &mut say)?;
            Some(compare_kill(&o, m, fit, &mut say)?)
        }
        None => None,
    };
    // The saturation search's live steps as recorded, the simulator's searched
    // again as the live search went (its first rate, its bisections).
    let saturation = match (recording.saturation, levels_options.last()) {
        (Some(recorded), Some(o)) => {
            let s = calibrate::replay_saturation(o, recorded, fit, a.bisect, &mut say)?;
            println!("\n{}", s.agreement());
            Some(s)
        }
        _ => None,
    };
    write_json(
        a.json.as_deref(),
        &Report {
            levels,
            kill,
            saturation,
        },
    )
}

/// The kill's level simulated again with the fitted costs, compared and printed.
fn compare_kill(
    o: &Options,
    m: Measured,
    fit: Fit,
    say: &mut dyn FnMut(&str),
) -> Result<Calibration> {
    let report = calibrate::finish(o, m, fit, say)?;
    println!("\n{report}");
    Ok(report)
}

fn write_json(path: Option<&std::path::Path>, report: &Report) -> Result<()> {
    match path {
        Some(path) => report.write(path),
        None => Ok(()),
    }
}
