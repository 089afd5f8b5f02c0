//! Capacity drills (`pangea sim capacity`): the load at which one region's
//! frontends stop getting their SLO, with every replica in service or with some
//! of the region's replicas out — the headroom an operator plans with.
//!
//! The drill's deployment, workload mix and other regions' load stay as the file
//! has them, its faults are dropped, and the region's load is raised step by step
//! (×1.5) from the file's rate until a step misses the SLO: p99 of some read mode
//! in the region above the bound, or more than 0.1 % of the region's reads failed.
//! Then the last rate that met it and the first that did not are bisected. Each
//! step is a run of its own: `warmup` seconds of load unmeasured (default
//! [`WARMUP_S`]), then `seconds`
//! measured, and a short drain; the replicas left out are crashed (their
//! processes down, connections refused) for the whole run.

use crate::scenario::{Fault, FaultKind, RegionLoad, Scenario};
use crate::sim::metrics::RunReport;
use crate::time::SimDuration;
use anyhow::{Result, bail};
use pangea_topology::{RegionId, ReplicaId};
use serde::Serialize;
use std::collections::BTreeMap;

/// Seconds of load before a step's measurement starts, by default.
pub const WARMUP_S: u64 = 2;

/// What to search.
#[derive(Debug, Clone)]
pub struct Query {
    pub region: RegionId,
    /// Replicas out of service for the whole run.
    pub without: Vec<ReplicaId>,
    /// Virtual seconds of load per step.
    pub seconds: u64,
    /// Virtual seconds of load before each step's measurement.
    pub warmup: u64,
    /// The region's frontends first write every row of their key set once
    /// ([`RegionLoad::fill`]), so the measurement sees it at its steady size
    /// whatever the rate.
    pub fill: bool,
    /// The p99 bound for every read mode in the region, in ms.
    pub slo_ms: f64,
    /// The first rate tried (default: the file's rate for the region).
    pub from: Option<f64>,
    /// Bisection steps once the SLO was missed.
    pub bisect: u32,
    /// Threads for runs that can be split.
    pub threads: usize,
}

/// One load level and what the region's frontends got.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// Operations per second from the region's frontends.
    pub rate: f64,
    pub reads: u64,
    pub errors: u64,
    /// p99 per read mode in the region (answered reads), ms.
    pub p99_ms: BTreeMap<String, f64>,
    /// The busiest of the region's hosts: its cores' busy share.
    pub cpu_max: f64,
    /// The busiest replication driver of the region's hosts: the share of its
    /// one core it kept busy.
    pub driver_max: f64,
    /// The busiest host (by `cpu_max`) and its cores' time by kind of work
    /// (share of its cores, pieces of work).
    pub busiest: String,
    pub busiest_work: BTreeMap<String, (f64, u64)>,
    /// Virtual seconds the shares are of (the run, drain included).
    pub over_s: f64,
    pub met_slo: bool,
    pub wall_s: f64,
}

/// The search's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Capacity {
    pub region: String,
    pub without: Vec<String>,
    pub slo_ms: f64,
    pub seconds: u64,
    pub warmup_s: u64,
    pub steps: Vec<Step>,
    /// The highest rate that met the SLO.
    pub capacity: Option<f64>,
    /// The lowest rate that missed it.
    pub first_miss: Option<f64>,
}

/// Runs the search on `base` (a drill's scenario), reporting each step as it ends.
pub fn search(base: &Scenario, q: &Query, mut progress: impl FnMut(&Step)) -> Result<Capacity> {
    if !base.deployment.topology.regions.contains_key(&q.region) {
        bail!("unknown region {:?}", q.region.as_str());
    }
    for r in &q.without {
        match base.deployment.topology.replicas.get(r) {
            Some(rep) if rep.region == q.region => {}
            Some(rep) => bail!(
                "replica {r} is in {}, not in {}",
                rep.region,
                q.region.as_str()
            ),
            None => bail!("unknown replica {:?}", r.as_str()),
        }
    }
    let file_rate = base
        .workload
        .regions
        .iter()
        .find(|l| l.region == q.region)
        .map_or(0.0, |l| l.rate);
    let rate = q.from.unwrap_or(file_rate).max(10.0);
    let mut out = Capacity {
        region: q.region.to_string(),
        without: q.without.iter().map(ToString::to_string).collect(),
        slo_ms: q.slo_ms,
        seconds: q.seconds,
        warmup_s: q.warmup,
        steps: Vec::new(),
        capacity: None,
        first_miss: None,
    };
    let (capacity, first_miss) = search_rate(rate, q.bisect, |rate| {
        let s = run_step(base, q, rate)?;
        progress(&s);
        let met = s.met_slo;
        out.steps.push(s);
        Ok(met)
    })?;
    (out.capacity, out.first_miss) = (capacity, first_miss);
    Ok(out)
}

/// The search both capacity drills and `pangea sim calibrate`'s live saturation
/// run: `met(rate)` runs a step and says whether it met the SLO; rates go up by
/// half from `from` until one misses (at most 40 steps: ×10^7) — or, if `from`
/// already misses, down by a third until one meets it (at most 10 steps) — then
/// `bisect` steps halve the gap between the highest rate met and the lowest
/// missed. Returns those two rates (`None` for a side never reached).
pub fn search_rate(
    from: f64,
    bisect: u32,
    mut met: impl FnMut(f64) -> Result<bool>,
) -> Result<(Option<f64>, Option<f64>)> {
    // The highest rate met, the lowest missed.
    let mut found = (None::<f64>, None::<f64>);
    let mut step = |rate: f64, found: &mut (Option<f64>, Option<f64>)| -> Result<()> {
        if met(rate)? {
            found.0 = Some(found.0.map_or(rate, |c| c.max(rate)));
        } else {
            found.1 = Some(found.1.map_or(rate, |m| m.min(rate)));
        }
        Ok(())
    };
    let mut rate = from;
    for _ in 0..40 {
        step(rate, &mut found)?;
        if found.1.is_some() {
            break;
        }
        rate *= 1.5;
    }
    if found.1.is_none() {
        bail!("the SLO held up to {rate:.0} ops/s: is the load reaching it?");
    }
    let mut rate = from;
    for _ in 0..10 {
        if found.0.is_some() {
            break;
        }
        rate /= 1.5;
        step(rate, &mut found)?;
    }
    for _ in 0..bisect {
        let (Some(lo), Some(hi)) = found else {
            break;
        };
        step((lo + hi) / 2.0, &mut found)?;
    }
    Ok(found)
}

fn run_step(base: &Scenario, q: &Query, rate: f64) -> Result<Step> {
    let mut sc = base.clone();
    sc.name = format!("{}-capacity-{rate:.0}", base.name);
    // Measured after a warm-up: frontends have learned their round trips and
    // which replicas are out, and replicas have suspected the missing ones.
    sc.warmup = SimDuration::from_secs(q.warmup);
    sc.duration = SimDuration::from_secs(q.warmup + q.seconds);
    sc.drain_max = SimDuration::from_secs(5);
    sc.faults.clear();
    sc.slo = Default::default();
    if !q.without.is_empty() {
        sc.faults.push(Fault {
            at: SimDuration::ZERO,
            duration: None,
            kind: FaultKind::Lose {
                replicas: q.without.clone(),
                regions: Vec::new(),
                silent: false,
            },
            label: format!("without {}", crate::drill::names(&q.without)),
        });
    }
    match sc
        .workload
        .regions
        .iter_mut()
        .find(|l| l.region == q.region)
    {
        Some(l) => {
            l.rate = rate;
            l.fill = q.fill;
        }
        None => sc.workload.regions.push(RegionLoad {
            fill: q.fill,
            region: q.region.clone(),
            clients: 2,
            rate,
        }),
    }
    let r = crate::sim::run_scenario(sc, q.threads)?;
    Ok(step_of(base, &r, q, rate))
}

fn step_of(base: &Scenario, r: &RunReport, q: &Query, rate: f64) -> Step {
    let region = q.region.as_str();
    let modes = r.reads_by_region_mode.get(region);
    let p99_ms: BTreeMap<String, f64> = modes
        .into_iter()
        .flatten()
        .filter(|(_, s)| s.count > s.errors)
        .map(|(m, s)| (m.clone(), s.p99_ms))
        .collect();
    let (reads, errors) = r
        .reads_by_region
        .get(region)
        .map_or((0, 0), |s| (s.count, s.errors));
    let hosts = base.deployment.topology.regions[&q.region]
        .replicas
        .iter()
        .filter_map(|id| Some((id.as_str(), r.hosts.get(id.as_str())?)));
    let (cpu_max, driver_max) = hosts.clone().fold((0.0, 0.0), |(cpu, driver), (_, h)| {
        (f64::max(cpu, h.cpu), f64::max(driver, h.driver))
    });
    let (busiest, busiest_work) = hosts
        .max_by(|a, b| a.1.cpu.total_cmp(&b.1.cpu))
        .map(|(id, h)| {
            let work = h.work.iter().map(|(k, v)| (k.to_string(), *v)).collect();
            (id.to_owned(), work)
        })
        .unwrap_or_default();
    let met_slo = reads > 0 && errors * 1000 <= reads && p99_ms.values().all(|p| *p <= q.slo_ms);
    Step {
        rate,
        reads,
        errors,
        p99_ms,
        cpu_max,
        driver_max,
        busiest,
        busiest_work,
        over_s: r.virtual_s,
        met_slo,
        wall_s: r.wall_s,
    }
}

#[cfg(test)]
mod tests {
    use super::search_rate;

    /// The rates `search_rate` tries against a system that meets its SLO up to
    /// `limit`, and what it finds.
    fn search(from: f64, limit: f64) -> (Vec<f64>, (Option<f64>, Option<f64>)) {
        let mut tried = Vec::new();
        let found = search_rate(from, 2, |rate| {
            tried.push(rate);
            Ok(rate <= limit)
        })
        .expect("a limit to find");
        (tried, found)
    }

    #[test]
    fn the_search_brackets_the_limit_from_below_and_from_above() {
        let (tried, found) = search(400.0, 1_000.0);
        assert_eq!(tried[..4], [400.0, 600.0, 900.0, 1_350.0]);
        assert_eq!(tried[4], 1_125.0, "bisected");
        assert_eq!(found, (Some(900.0), Some(1_012.5)));
        // Starting above the limit: down by a third a step until one is met.
        let (tried, found) = search(3_000.0, 1_000.0);
        assert_eq!(tried[..3], [3_000.0, 2_000.0, 2_000.0 / 1.5]);
        let (met, missed) = (found.0.expect("met"), found.1.expect("missed"));
        assert!(met <= 1_000.0 && 1_000.0 < missed && missed - met < 1_000.0);
        // A limit that is never reached is an error, not a capacity.
        assert!(search_rate(10.0, 0, |_| Ok(true)).is_err());
    }
}
