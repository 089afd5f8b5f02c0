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
    /// The load at which one region's frontends stop getting their SLO (p99 of
    /// every read mode under --slo-ms, at most 0.1 % of reads failed), with every
    /// replica in service or without some of the region's (docs/drills.md,
    /// "Capacity").
    Capacity {
        /// A drill file: its deployment, workload mix and other regions' load
        /// (its faults are dropped).
        drill: PathBuf,
        /// The region whose load is raised.
        #[arg(long)]
        region: String,
        /// Replicas of the region out of service for the whole run (repeatable).
        #[arg(long)]
        without: Vec<String>,
        /// Virtual seconds of load per step.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Virtual seconds of load before each step's measurement.
        #[arg(long, default_value_t = pangea_sim::capacity::WARMUP_S)]
        warmup: u64,
        /// The region's frontends first write every row of their key set once,
        /// in key order, so that the measurement sees every row at every rate.
        #[arg(long)]
        fill: bool,
        #[arg(long, default_value_t = 20.0)]
        slo_ms: f64,
        /// The first rate tried (default: the file's rate for the region).
        #[arg(long)]
        from: Option<f64>,
        /// Bisection steps between the last rate that met the SLO and the first
        /// that missed it.
        #[arg(long, default_value_t = 4)]
        bisect: u32,
        /// Write the steps and the result as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Run one steady workload in the simulator and on a live local cluster with
    /// emulated WAN, and print both side by side: p99 read latency per region and
    /// mode, p99 replication lag per origin and replica (docs/drills.md, Fidelity).
    Calibrate(crate::calibrate_cmd::CalibrateArgs),
}

pub(crate) fn run(cmd: SimCommand) -> Result<()> {
    match cmd {
        SimCommand::Calibrate(args) => crate::calibrate_cmd::run(args),
        SimCommand::Capacity {
            drill,
            region,
            without,
            seconds,
            warmup,
            fill,
            slo_ms,
            from,
            bisect,
            json,
        } => {
            let d = Drill::load(&drill).map_err(|p| anyhow::anyhow!("{p}"))?;
            let q = pangea_sim::capacity::Query {
                region: region.as_str().into(),
                without: without.iter().map(|r| r.as_str().into()).collect(),
                seconds,
                warmup,
                fill,
                slo_ms,
                from,
                bisect,
                threads: pangea_sim::sim::default_threads(),
            };
            println!(
                "{:>10}  {:>8}  {:>6}  {:>8}  {:>10}  p99 by mode (ms); the busiest host's cores by work",
                "ops/s", "reads", "errors", "cpu max", "driver max"
            );
            let c = pangea_sim::capacity::search(&d.scenario, &q, |s| {
                let p99: Vec<String> = s
                    .p99_ms
                    .iter()
                    .map(|(m, p)| format!("{m} {p:.2}"))
                    .collect();
                let work: Vec<String> = s
                    .busiest_work
                    .iter()
                    .map(|(w, (share, n))| format!("{w} {:.1}% in {n}", share * 100.0))
                    .chain(std::iter::once(format!("over {:.1} s", s.over_s)))
                    .collect();
                println!(
                    "{:>10.0}  {:>8}  {:>6}  {:>7.1}%  {:>9.1}%  {}  {}  ({}: {})",
                    s.rate,
                    s.reads,
                    s.errors,
                    s.cpu_max * 100.0,
                    s.driver_max * 100.0,
                    p99.join(", "),
                    if s.met_slo { "ok" } else { "MISSED" },
                    s.busiest,
                    work.join(", ")
                );
            })?;
            println!(
                "{}{}: meets p99 < {} ms up to {} ops/s (first missed at {} ops/s)",
                c.region,
                if c.without.is_empty() {
                    String::new()
                } else {
                    format!(" without {}", c.without.join(", "))
                },
                c.slo_ms,
                c.capacity.map_or("—".into(), |r| format!("{r:.0}")),
                c.first_miss.map_or("—".into(), |r| format!("{r:.0}")),
            );
            if let Some(j) = json {
                std::fs::write(&j, serde_json::to_string_pretty(&c)? + "\n")?;
            }
            Ok(())
        }
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
