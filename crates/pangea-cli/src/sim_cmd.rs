//! `pangea sim`: failover drills and swarm testing in virtual time
//! (`pangea-sim`; see docs/drills.md).

use anyhow::{Result, bail};
use clap::Subcommand;
use pangea_sim::drill::{Drill, drill_files};
use pangea_sim::runner::{one_screen, run_drill, write_outputs};
use pangea_sim::swarm::{SwarmOptions, replay_command, swarm};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Subcommand)]
pub(crate) enum SimCommand {
    /// Run a drill file; exit non-zero if an SLO or an invariant fails.
    Run {
        /// A drill file (sim/drills/*.toml).
        drill: PathBuf,
        /// Replace the file's seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Write the JSON report here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write report.json, summary.md and SVG charts into this directory.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Threads for a run split into shards (a drill without faults): the result
        /// is the same for any count (default: 2 on a machine with two cores).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Validate drill files (or every drill of a directory); print every problem
    /// as file:line: key: message.
    Check {
        /// Drill files or directories (default: sim/drills).
        paths: Vec<PathBuf>,
    },
    /// Random deployments, workloads and faults, one per seed: a safety phase with
    /// faults, then a healed liveness phase; checkers C1–C6 on every run.
    Swarm {
        /// How many seeds.
        #[arg(long, default_value_t = 100)]
        seeds: u64,
        /// The first seed.
        #[arg(long, default_value_t = 0)]
        start: u64,
        /// Stop starting seeds after this many seconds of wall time.
        #[arg(long)]
        time_limit_s: Option<u64>,
        /// Run every n-th seed twice and compare trace hashes (C6); 0 never.
        #[arg(long, default_value_t = 10)]
        determinism_every: u64,
    },
    /// Run one steady workload in the simulator and on a live local cluster with
    /// emulated WAN, and print both side by side: p99 read latency per region and
    /// mode, p99 replication lag per origin and replica (docs/drills.md, Fidelity).
    Calibrate(crate::calibrate_cmd::CalibrateArgs),
}

pub(crate) fn run(cmd: SimCommand) -> Result<()> {
    match cmd {
        SimCommand::Calibrate(args) => crate::calibrate_cmd::run(args),
        SimCommand::Run {
            drill,
            seed,
            json,
            report,
            threads,
        } => {
            let threads = threads.unwrap_or_else(pangea_sim::sim::default_threads);
            let run = run_drill(&drill, seed, threads)?;
            write_outputs(&run, json.as_deref(), report.as_deref())?;
            print!("{}", one_screen(&run));
            if !run.report.passed() {
                bail!(
                    "drill {} failed ({} problem(s)); replay: pangea sim run {} --seed {}",
                    run.report.drill,
                    run.report.slo_failures.len(),
                    drill.display(),
                    run.report.seed
                );
            }
            Ok(())
        }
        SimCommand::Check { paths } => {
            let paths = if paths.is_empty() {
                vec![PathBuf::from("sim/drills")]
            } else {
                paths
            };
            let mut files = Vec::new();
            for p in paths {
                if p.is_dir() {
                    files.extend(drill_files(&p)?);
                } else {
                    files.push(p);
                }
            }
            let mut bad = 0;
            for f in &files {
                match Drill::load(f) {
                    Ok(d) => println!(
                        "ok {} ({} faults, {:.0} s)",
                        f.display(),
                        d.scenario.faults.len(),
                        d.scenario.duration.as_secs_f64()
                    ),
                    Err(problems) => {
                        bad += 1;
                        eprintln!("{problems}");
                    }
                }
            }
            if bad > 0 {
                bail!("{bad} of {} drill file(s) have problems", files.len());
            }
            Ok(())
        }
        SimCommand::Swarm {
            seeds,
            start,
            time_limit_s,
            determinism_every,
        } => {
            let opts = SwarmOptions {
                seeds,
                start,
                time_limit: time_limit_s.map(Duration::from_secs),
                determinism_every,
            };
            let summary = swarm(&opts, |o| {
                if o.passed() {
                    println!(
                        "seed {:>6} ok   {:>2} replicas {:>3} faults {:>6} ops  {:.2} s  trace {}{}",
                        o.seed,
                        o.replicas,
                        o.faults,
                        o.operations,
                        o.wall_s,
                        o.trace_hash,
                        if o.shards > 1 { "  split" } else { "" }
                    );
                } else {
                    println!(
                        "seed {:>6} FAIL  replay: {}",
                        o.seed,
                        replay_command(o.seed)
                    );
                    for f in &o.failures {
                        println!("    {f}");
                    }
                }
            });
            println!(
                "{} seeds in {:.1} s, {} failed",
                summary.seeds_run,
                summary.wall_s,
                summary.failed.len()
            );
            if !summary.failed.is_empty() {
                for o in &summary.failed {
                    eprintln!("failing seed {}: {}", o.seed, replay_command(o.seed));
                }
                bail!("{} seed(s) failed", summary.failed.len());
            }
            Ok(())
        }
    }
}
