//! The `pangea sim` command without clap, for running drills from this crate
//! before the CLI wires `sim_cmd.rs` in:
//!
//! `cargo run --release -p pangea-sim --example sim -- DRILL [--seed N] [--json OUT] [--report DIR]`
//! `cargo run --release -p pangea-sim --example sim -- swarm [--seeds N] [--start S]`

use anyhow::{Result, bail};
use pangea_sim::runner::{one_screen, run_drill, write_outputs};
use std::path::PathBuf;

fn main() -> Result<()> {
    if std::env::args().nth(1).as_deref() == Some("swarm") {
        return swarm_main();
    }
    if std::env::args().nth(1).as_deref() == Some("show") {
        let seed: u64 = std::env::args().nth(2).unwrap_or_default().parse()?;
        let sc = pangea_sim::swarm::scenario_for_seed(seed);
        println!(
            "safety {} replicas {:?}",
            sc.duration,
            sc.deployment.topology.replicas.keys().collect::<Vec<_>>()
        );
        println!(
            "policies {:?}",
            sc.deployment
                .placement
                .policies
                .values()
                .map(|p| (
                    p.name.to_string(),
                    p.regions.iter().map(|r| r.to_string()).collect::<Vec<_>>()
                ))
                .collect::<Vec<_>>()
        );
        println!(
            "config log_retained {} gap_max {} batch {}",
            sc.replica.log_entries_retained_max,
            sc.replica.gap_entries_max,
            sc.replica.batch_bytes_max
        );
        for f in &sc.faults {
            println!(
                "  at {} for {:?}: {} {:?}",
                f.at,
                f.duration.map(|d| d.to_string()),
                f.label,
                match &f.kind {
                    pangea_sim::scenario::FaultKind::Partition { a, b, one_way } =>
                        format!("{a:?} | {b:?} one_way {one_way}"),
                    pangea_sim::scenario::FaultKind::DegradeLink { a, b, link } =>
                        format!("{a:?} | {b:?} {link:?}"),
                    _ => String::new(),
                }
            );
        }
        let r = pangea_sim::sim::Simulation::new(sc)?.run()?;
        println!(
            "{:?}\n{:?}",
            r.slo_failures,
            r.violations
                .iter()
                .map(|v| v.lines().next().unwrap_or("").to_owned())
                .collect::<Vec<_>>()
        );
        println!("{:?}", r.counters);
        return Ok(());
    }
    let mut args = std::env::args().skip(1);
    let (mut drill, mut seed, mut json, mut report) = (None, None, None, None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seed" => seed = args.next().map(|s| s.parse()).transpose()?,
            "--json" => json = args.next().map(PathBuf::from),
            "--report" => report = args.next().map(PathBuf::from),
            _ => drill = Some(PathBuf::from(a)),
        }
    }
    let Some(drill) = drill else {
        bail!("usage: sim DRILL [--seed N] [--json OUT] [--report DIR]")
    };
    let run = run_drill(&drill, seed, pangea_sim::sim::default_threads())?;
    write_outputs(&run, json.as_deref(), report.as_deref())?;
    print!("{}", one_screen(&run));
    if !run.report.passed() {
        std::process::exit(1);
    }
    Ok(())
}

fn swarm_main() -> Result<()> {
    let mut args = std::env::args().skip(2);
    let mut opts = pangea_sim::swarm::SwarmOptions {
        seeds: 20,
        start: 0,
        time_limit: None,
        determinism_every: 10,
    };
    while let Some(a) = args.next() {
        let v: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(0);
        match a.as_str() {
            "--seeds" => opts.seeds = v,
            "--start" => opts.start = v,
            "--time-limit-s" => opts.time_limit = Some(std::time::Duration::from_secs(v)),
            _ => bail!("unknown flag {a}"),
        }
    }
    let summary = pangea_sim::swarm::swarm(&opts, |o| {
        println!(
            "seed {:>6} {}  {:>2} replicas {:>3} faults {:>6} ops {:.2} s",
            o.seed,
            if o.passed() { "ok  " } else { "FAIL" },
            o.replicas,
            o.faults,
            o.operations,
            o.wall_s
        );
        for f in &o.failures {
            println!("    {f}");
        }
    });
    println!(
        "{} seeds, {} failed, {:.1} s",
        summary.seeds_run,
        summary.failed.len(),
        summary.wall_s
    );
    if !summary.failed.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
