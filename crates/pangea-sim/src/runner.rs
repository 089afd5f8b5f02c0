//! Entry points for the `pangea sim` command (and the `sim` example): run a drill
//! file, write its report, tell pass from fail.

use crate::charts::write_report_dir;
use crate::drill::Drill;
use crate::sim::metrics::{BACKGROUND, FRONTENDS, RunReport};
use anyhow::{Context, Result};
use std::path::Path;

/// What one `pangea sim run` produced.
#[derive(Debug)]
pub struct DrillRun {
    pub drill: Drill,
    pub report: RunReport,
}

/// Loads a drill, runs it (with `seed` instead of the file's, if given; split into
/// shards on up to `threads` threads when it can be, see
/// [`crate::sim::run_scenario`]), and fills in the process's peak memory.
pub fn run_drill(path: &Path, seed: Option<u64>, threads: usize) -> Result<DrillRun> {
    let mut drill = Drill::load(path).map_err(|p| anyhow::anyhow!("{p}"))?;
    if let Some(s) = seed {
        drill.scenario.seed = s;
    }
    let mut report = crate::sim::run_scenario(drill.scenario.clone(), threads)
        .with_context(|| format!("running {}", path.display()))?;
    report.peak_rss_mib = peak_rss_mib();
    Ok(DrillRun { drill, report })
}

/// Writes the JSON report to `json` and the report directory to `dir`, if given.
pub fn write_outputs(run: &DrillRun, json: Option<&Path>, dir: Option<&Path>) -> Result<()> {
    if let Some(j) = json {
        if let Some(parent) = j.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(j, serde_json::to_string_pretty(&run.report)? + "\n")
            .with_context(|| format!("writing {}", j.display()))?;
    }
    if let Some(d) = dir {
        write_report_dir(d, &run.drill.scenario, &run.drill.description, &run.report)
            .with_context(|| format!("writing {}", d.display()))?;
    }
    Ok(())
}

/// A few lines for a terminal.
pub fn one_screen(run: &DrillRun) -> String {
    let r = &run.report;
    let mut s = format!(
        "{} {}: seed {}, {:.0} s virtual in {:.2} s wall ({:.1}x; {:.2} s CPU, {:.1}x), trace {}\n",
        if r.passed() { "PASS" } else { "FAIL" },
        r.drill,
        r.seed,
        r.virtual_s,
        r.wall_s,
        r.speedup,
        r.cpu_s.unwrap_or(0.0),
        r.speedup_cpu.unwrap_or(0.0),
        r.trace_hash
    );
    if let Some(l) = r.lookahead_ms {
        s += &format!(
            "  split into {} shards ({l:.1} ms apart), run side by side\n",
            r.shards
        );
    }
    for (m, x) in &r.reads_by_mode {
        s += &format!(
            "  {m:<9} reads {:>8}  errors {:>6}  p50 {:>7.2} ms  p99 {:>7.2} ms  p99.9 {:>7.2} ms\n",
            x.count, x.errors, x.p50_ms, x.p99_ms, x.p999_ms
        );
    }
    s += &format!(
        "  availability {:.5}  lag p99 {:.1} ms max {:.1} ms  convergence {}  lost {}  violations wm {} token {} stale {}  leak {} B\n",
        r.availability,
        r.replication_lag_ms.p99,
        r.replication_lag_ms.max,
        r.convergence_ms
            .map_or("never".into(), |c| format!("{c:.0} ms")),
        r.lost_writes,
        r.watermark_violations,
        r.token_violations,
        r.staleness_violations,
        r.residency_leak_bytes
    );
    let b = &r.batches;
    if b.count > 0 {
        s += &format!(
            "  batches   writes {:>8}  errors {:>6}  p50 {:>7.2} ms  p99 {:>7.2} ms  p99.9 {:>7.2} ms  rows acknowledged {} refused {}\n",
            b.count,
            b.errors,
            b.p50_ms,
            b.p99_ms,
            b.p999_ms,
            r.counters.batch_rows_acknowledged,
            r.counters.batch_rows_refused
        );
    }
    if r.counters.increments_acknowledged > 0 {
        s += &format!(
            "  counters: {} increments acknowledged, {} not counted by a replica holding them (C8)\n",
            r.counters.increments_acknowledged, r.lost_increments
        );
    }
    let busiest = |load: fn(&crate::sim::metrics::HostLoad) -> f64| {
        r.hosts
            .iter()
            .filter(|(id, _)| ![FRONTENDS, BACKGROUND].contains(&id.as_str()))
            .max_by(|a, b| load(a.1).total_cmp(&load(b.1)))
            .map(|(id, h)| (id.as_str(), load(h) * 100.0))
    };
    if let (Some((cid, cpu)), Some((did, disk))) = (busiest(|h| h.cpu), busiest(|h| h.disk)) {
        s += &format!(
            "  busiest host: cores {cpu:.1} % ({cid}), disk {disk:.1} % ({did}), over the run\n"
        );
    }
    for f in &r.slo_failures {
        s += &format!("  FAILED: {f}\n");
    }
    s
}

/// The process's peak resident memory in MiB (Linux `/proc/self/status` VmHWM).
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}
