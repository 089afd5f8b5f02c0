//! A drill's report directory: `report.json`, `summary.md`, and hand-written SVG
//! charts (no plotting dependency, as `pangea_topology::svg` draws topologies):
//! - `latency.svg`: p99 read latency over time per client region, faults shaded;
//! - `lag.svg`: replication lag over time (p99 and max per bucket), faults shaded;
//! - `lag-heatmap.svg`: p99 replication lag from each origin (rows) to each replica
//!   (columns);
//! - `topology.svg`: the deployment and each scope's tree.

use crate::scenario::Scenario;
use crate::sim::metrics::RunReport;
use std::fmt::Write as _;
use std::path::Path;

const PALETTE: [&str; 13] = [
    "#1f6feb", "#d1242f", "#1a7f37", "#8250df", "#bc4c00", "#0a7b83", "#bf3989", "#6e7781",
    "#953800", "#0550ae", "#116329", "#a40e26", "#4d2d00",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A nice upper bound for an axis.
fn nice_max(x: f64) -> f64 {
    if x <= 0.0 || !x.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(x.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * p >= x {
            return m * p;
        }
    }
    10.0 * p
}

struct Plot {
    w: f64,
    h: f64,
    left: f64,
    top: f64,
    right: f64,
    bottom: f64,
    x_max: f64,
    y_max: f64,
    log_y: bool,
}

impl Plot {
    fn x(&self, v: f64) -> f64 {
        self.left + (self.w - self.left - self.right) * (v / self.x_max).clamp(0.0, 1.0)
    }

    fn y(&self, v: f64) -> f64 {
        let f = if self.log_y {
            let lo = 0.1f64.ln();
            ((v.max(0.1)).ln() - lo) / (self.y_max.ln() - lo)
        } else {
            v / self.y_max
        };
        self.h - self.bottom - (self.h - self.top - self.bottom) * f.clamp(0.0, 1.0)
    }

    fn frame(&self, out: &mut String, title: &str, x_label: &str, y_label: &str) {
        let _ = write!(
            out,
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/><text x="{tx}" y="18" font-size="14" font-weight="bold">{t}</text>"##,
            w = self.w,
            h = self.h,
            tx = self.left,
            t = esc(title)
        );
        let (x0, x1) = (self.left, self.w - self.right);
        let (y0, y1) = (self.h - self.bottom, self.top);
        let _ = write!(
            out,
            r##"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="#333"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="#333"/>"##
        );
        for i in 0..=5 {
            let v = self.x_max * i as f64 / 5.0;
            let x = self.x(v);
            let _ = write!(
                out,
                r##"<line x1="{x}" y1="{y0}" x2="{x}" y2="{}" stroke="#333"/><text x="{x}" y="{}" text-anchor="middle">{v:.0}</text>"##,
                y0 + 4.0,
                y0 + 16.0
            );
        }
        let ticks: Vec<f64> = if self.log_y {
            let mut t = Vec::new();
            let mut v = 0.1;
            while v <= self.y_max * 1.0001 {
                t.push(v);
                v *= 10.0;
            }
            t
        } else {
            (0..=4).map(|i| self.y_max * i as f64 / 4.0).collect()
        };
        for v in ticks {
            let y = self.y(v);
            let _ = write!(
                out,
                r##"<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
                x0 - 4.0,
                y + 4.0,
                if v >= 1.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v}")
                }
            );
        }
        let _ = write!(
            out,
            r##"<text x="{}" y="{}" text-anchor="middle">{}</text><text transform="translate(14,{}) rotate(-90)" text-anchor="middle">{}</text>"##,
            (x0 + x1) / 2.0,
            self.h - 6.0,
            esc(x_label),
            (y0 + y1) / 2.0,
            esc(y_label)
        );
    }

    fn faults(&self, out: &mut String, r: &RunReport, end_s: f64) {
        for (i, f) in r.faults.iter().enumerate() {
            let x0 = self.x(f.start_s);
            let x1 = self.x(f.end_s.unwrap_or(end_s)).max(x0 + 1.5);
            let _ = write!(
                out,
                r##"<rect x="{x0}" y="{}" width="{}" height="{}" fill="#d1242f" fill-opacity="0.08" stroke="#d1242f" stroke-opacity="0.4" stroke-dasharray="3,2"><title>{}</title></rect><text x="{}" y="{}" fill="#d1242f" font-size="10">{}</text>"##,
                self.top,
                x1 - x0,
                self.h - self.top - self.bottom,
                esc(&f.label),
                x0 + 2.0,
                self.top + 10.0 + 11.0 * (i % 6) as f64,
                esc(&truncate(&f.label, 40))
            );
        }
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

/// p99 read latency per region over time, log scale, faults shaded.
pub fn latency_svg(r: &RunReport) -> String {
    let end_s = r.virtual_s.max(1.0);
    let y_top = r
        .series_by_region
        .values()
        .flatten()
        .map(|p| p.p99_ms)
        .fold(1.0, f64::max);
    let p = Plot {
        w: 900.0,
        h: 420.0,
        left: 60.0,
        top: 30.0,
        right: 150.0,
        bottom: 40.0,
        x_max: end_s,
        y_max: nice_max(y_top).max(10.0),
        log_y: true,
    };
    let mut out = String::new();
    p.frame(
        &mut out,
        &format!("{}: p99 read latency per client region", r.drill),
        "virtual time (s)",
        "p99 latency (ms, log)",
    );
    p.faults(&mut out, r, end_s);
    for (i, (region, pts)) in r.series_by_region.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        // A bucket without answered reads (a lost region, a cut-off client) breaks
        // the line rather than drawing a slope across the gap.
        let mut d = String::new();
        let mut last: Option<usize> = None;
        for (b, pt) in pts
            .iter()
            .enumerate()
            .filter(|(_, pt)| pt.reads > pt.errors)
        {
            let joined = last.is_some_and(|l| l + 1 == b);
            let _ = write!(
                d,
                "{}{:.1},{:.1}",
                if joined { " L" } else { " M" },
                p.x(pt.t_s),
                p.y(pt.p99_ms)
            );
            last = Some(b);
        }
        let _ = write!(
            out,
            r##"<path d="{d}" fill="none" stroke="{color}" stroke-width="1.3"/><text x="{}" y="{}" fill="{color}">{}</text>"##,
            p.w - p.right + 8.0,
            p.top + 12.0 + 14.0 * i as f64,
            esc(region)
        );
    }
    out += "</svg>\n";
    out
}

/// Replication lag over time: p99 and max per bucket, log scale.
pub fn lag_svg(r: &RunReport) -> String {
    let end_s = r.virtual_s.max(1.0);
    let y_top = r.lag_series.iter().map(|x| x.2).fold(1.0, f64::max);
    let p = Plot {
        w: 900.0,
        h: 360.0,
        left: 60.0,
        top: 30.0,
        right: 150.0,
        bottom: 40.0,
        x_max: end_s,
        y_max: nice_max(y_top),
        log_y: true,
    };
    let mut out = String::new();
    p.frame(
        &mut out,
        &format!("{}: replication lag", r.drill),
        "virtual time (s)",
        "lag (ms, log)",
    );
    p.faults(&mut out, r, end_s);
    for (k, (name, color)) in [("p99", "#1f6feb"), ("max", "#d1242f")].iter().enumerate() {
        let mut d = String::new();
        for x in r.lag_series.iter().filter(|x| x.2 > 0.0) {
            let v = if k == 0 { x.1 } else { x.2 };
            let _ = write!(
                d,
                "{}{:.1},{:.1}",
                if d.is_empty() { "M" } else { " L" },
                p.x(x.0),
                p.y(v)
            );
        }
        let _ = write!(
            out,
            r##"<path d="{d}" fill="none" stroke="{color}" stroke-width="1.3"/><text x="{}" y="{}" fill="{color}">{name}</text>"##,
            p.w - p.right + 8.0,
            p.top + 12.0 + 14.0 * k as f64
        );
    }
    out += "</svg>\n";
    out
}

/// p99 lag from origin (row) to replica (column), colour on a log scale.
pub fn heatmap_svg(r: &RunReport) -> String {
    let ids = &r.lag_matrix_ids;
    let n = ids.len();
    let cell = 18.0;
    let left = 110.0;
    let top = 120.0;
    let w = left + cell * n as f64 + 140.0;
    let h = top + cell * n as f64 + 30.0;
    let max = r
        .lag_matrix_p99_ms
        .iter()
        .flatten()
        .flatten()
        .fold(1.0f64, |a, &b| a.max(b));
    let mut out = String::new();
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="10"><rect width="100%" height="100%" fill="white"/><text x="10" y="18" font-size="14" font-weight="bold">{}: p99 replication lag, origin (row) → replica (column)</text>"##,
        esc(&r.drill)
    );
    let color = |v: f64| {
        // Log scale from 1 ms (pale) to the maximum (dark red).
        let f = if max <= 1.0 {
            0.0
        } else {
            (v.max(1.0).ln() / max.ln()).clamp(0.0, 1.0)
        };
        let (r0, g0, b0) = (255.0, 247.0, 236.0);
        let (r1, g1, b1) = (127.0, 0.0, 0.0);
        format!(
            "rgb({:.0},{:.0},{:.0})",
            r0 + (r1 - r0) * f,
            g0 + (g1 - g0) * f,
            b0 + (b1 - b0) * f
        )
    };
    for (j, id) in ids.iter().enumerate() {
        let x = left + cell * j as f64 + cell / 2.0;
        let _ = write!(
            out,
            r##"<text transform="translate({x},{}) rotate(-60)">{}</text>"##,
            top - 4.0,
            esc(id)
        );
    }
    for (i, row) in r.lag_matrix_p99_ms.iter().enumerate() {
        let y = top + cell * i as f64;
        let _ = write!(
            out,
            r##"<text x="{}" y="{}" text-anchor="end">{}</text>"##,
            left - 4.0,
            y + cell * 0.7,
            esc(&ids[i])
        );
        for (j, v) in row.iter().enumerate() {
            let x = left + cell * j as f64;
            let (fill, title) = match v {
                Some(v) => (color(*v), format!("{} → {}: {v:.1} ms", ids[i], ids[j])),
                None => (
                    "#f6f8fa".to_owned(),
                    format!("{} → {}: none", ids[i], ids[j]),
                ),
            };
            let _ = write!(
                out,
                r##"<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{fill}" stroke="white"><title>{}</title></rect>"##,
                esc(&title)
            );
        }
    }
    // Legend.
    let lx = left + cell * n as f64 + 20.0;
    for k in 0..=4 {
        let v = if max <= 1.0 {
            1.0
        } else {
            max.powf(k as f64 / 4.0)
        };
        let y = top + 22.0 * k as f64;
        let _ = write!(
            out,
            r##"<rect x="{lx}" y="{y}" width="16" height="16" fill="{}"/><text x="{}" y="{}">{v:.0} ms</text>"##,
            color(v),
            lx + 22.0,
            y + 12.0
        );
    }
    out += "</svg>\n";
    out
}

/// The Markdown summary of a run.
pub fn summary_md(sc: &Scenario, description: &str, r: &RunReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Drill `{}`\n", r.drill);
    if !description.is_empty() {
        let _ = writeln!(s, "{description}\n");
    }
    let verdict = if r.passed() { "PASSED" } else { "FAILED" };
    let split = match r.lookahead_ms {
        Some(l) => format!(
            "; split into {} shards {l:.1} ms apart, run side by side",
            r.shards
        ),
        None => String::new(),
    };
    let _ = writeln!(
        s,
        "**{verdict}** — seed {}, {:.0} s virtual in {:.1} s wall ({:.1}× real time; {:.1} s of CPU, {:.1}×{split}), trace `{}`.\n",
        r.seed,
        r.virtual_s,
        r.wall_s,
        r.speedup,
        r.cpu_s.unwrap_or(0.0),
        r.speedup_cpu.unwrap_or(0.0),
        r.trace_hash
    );
    let _ = writeln!(
        s,
        "Topology `{}`{}; {} replicas; {:.0} operations/s for {:.0} s ({} operations).\n",
        r.topology,
        r.placement
            .as_ref()
            .map(|p| format!(" with placement `{p}`"))
            .unwrap_or_default(),
        r.replicas,
        sc.workload.total_rate(),
        sc.duration.as_secs_f64(),
        r.operations
    );
    if !r.slo_failures.is_empty() {
        let _ = writeln!(s, "## Failures\n");
        for f in &r.slo_failures {
            let _ = writeln!(s, "- {f}");
        }
        s.push('\n');
    }
    let _ = writeln!(s, "## Faults\n");
    if r.faults.is_empty() {
        let _ = writeln!(s, "None.\n");
    } else {
        let _ = writeln!(s, "| start (s) | end (s) | fault |\n|---:|---:|---|");
        for f in &r.faults {
            let _ = writeln!(
                s,
                "| {:.1} | {} | {} |",
                f.start_s,
                f.end_s.map_or("end of load".into(), |e| format!("{e:.1}")),
                f.label
            );
        }
        s.push('\n');
    }
    let _ = writeln!(
        s,
        "## Reads by consistency mode\n\n| mode | reads | errors | p50 ms | p99 ms | p99.9 ms |\n|---|---:|---:|---:|---:|---:|"
    );
    for (m, x) in &r.reads_by_mode {
        let _ = writeln!(
            s,
            "| {m} | {} | {} | {:.2} | {:.2} | {:.2} |",
            x.count, x.errors, x.p50_ms, x.p99_ms, x.p999_ms
        );
    }
    let _ = writeln!(
        s,
        "| (writes) | {} | {} | {:.2} | {:.2} | {:.2} |",
        r.writes.count, r.writes.errors, r.writes.p50_ms, r.writes.p99_ms, r.writes.p999_ms
    );
    let b = &r.batches;
    if b.count > 0 {
        let _ = writeln!(
            s,
            "| (batch writes of {} rows in all) | {} | {} | {:.2} | {:.2} | {:.2} |",
            r.counters.batch_rows_acknowledged, b.count, b.errors, b.p50_ms, b.p99_ms, b.p999_ms
        );
    }
    s.push('\n');
    let _ = writeln!(
        s,
        "## Reads by client region\n\n| region | reads | errors | p50 ms | p99 ms | p99.9 ms |\n|---|---:|---:|---:|---:|---:|"
    );
    for (m, x) in &r.reads_by_region {
        let _ = writeln!(
            s,
            "| {m} | {} | {} | {:.2} | {:.2} | {:.2} |",
            x.count, x.errors, x.p50_ms, x.p99_ms, x.p999_ms
        );
    }
    let conv = |c: Option<f64>| c.map_or("never".to_owned(), |c| format!("{c:.0} ms"));
    let _ = writeln!(
        s,
        "\n## Outcome\n\n| | |\n|---|---|\n| availability | {:.5} |\n| replication lag p50 / p99 / max | {:.1} / {:.1} / {:.1} ms |\n| WAN bytes intra-region / inter-region / inter-continent | {} / {} / {} |\n| convergence after the last heal | {} |\n| convergence after the load stopped (digests equal) | {} |\n| lost writes | {} |\n| watermark violations (C2, C3) | {} |\n| token violations (C4) | {} |\n| bounded reads staler than promised (C7) | {} |\n| residency leak bytes | {} |\n| hedges / fallback races / failovers | {} / {} / {} |\n| gap requests / snapshots installed / suspicions | {} / {} / {} |",
        r.availability,
        r.replication_lag_ms.p50,
        r.replication_lag_ms.p99,
        r.replication_lag_ms.max,
        r.wan_bytes.intra_region,
        r.wan_bytes.inter_region,
        r.wan_bytes.inter_continent,
        conv(r.convergence_ms),
        conv(r.final_convergence_ms),
        r.lost_writes,
        r.watermark_violations,
        r.token_violations,
        r.staleness_violations,
        r.residency_leak_bytes,
        r.counters.hedges,
        r.counters.fallback_races,
        r.counters.failovers,
        r.counters.gap_requests,
        r.counters.snapshots_installed,
        r.counters.peer_suspicions,
    );
    if r.counters.increments_acknowledged > 0 {
        let _ = writeln!(
            s,
            "| counter increments acknowledged / not counted by a replica (C8) | {} / {} |",
            r.counters.increments_acknowledged, r.lost_increments
        );
    }
    s.push('\n');
    if !r.migrations.is_empty() {
        let _ = writeln!(
            s,
            "## Migrations\n\n| job | runner | phase | rows counted / copied | start (s) | end (s) |\n|---|---|---|---:|---:|---:|"
        );
        for m in &r.migrations {
            let end = m.end_s.map_or("running".to_owned(), |e| format!("{e:.1}"));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} / {} | {:.1} | {end} |",
                m.label, m.runner, m.phase, m.rows_total, m.rows_copied, m.start_s
            );
        }
        let _ = writeln!(
            s,
            "\nRows purged by replicas outside the new policy: {}; calls that refreshed \
             location metadata after a refusal: {}.\n",
            r.counters.rows_purged, r.counters.policy_refreshes
        );
    }
    for b in &r.backups {
        let end = b.end_s.map_or("running".to_owned(), |e| format!("{e:.2}"));
        let _ = writeln!(
            s,
            "## {}\n\nFrom {}, {:.2} s to {end} s. Each scope's rows with its tail merged \
             are checked against every durable write up to its cut (C10).\n\n\
             | scope | read from | failed over from | rows | tail changes | exact | C10 | end (s) |\n\
             |---|---|---|---:|---:|---|---|---:|",
            b.label, b.region, b.start_s
        );
        for l in &b.scopes {
            let end = l.end_s.map_or("running".to_owned(), |e| format!("{e:.2}"));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {end} |",
                l.scope,
                l.replica,
                l.failovers.join("; "),
                l.rows,
                l.changes,
                if l.exact { "yes" } else { "no" },
                l.state
            );
        }
        for k in &b.skipped {
            let _ = writeln!(s, "\nSkipped {k}.");
        }
        let _ = writeln!(s);
    }
    if !r.counters.read_errors.is_empty() {
        let _ = writeln!(s, "Read errors by kind: {:?}\n", r.counters.read_errors);
    }
    if !r.counters.frames_rejected.is_empty() {
        let _ = writeln!(
            s,
            "Frames refused by replicas: {:?}\n",
            r.counters.frames_rejected
        );
    }
    if !r.violations.is_empty() {
        let _ = writeln!(s, "## Violations\n");
        for v in &r.violations {
            let _ = writeln!(s, "```\n{v}\n```");
        }
    }
    let _ = writeln!(
        s,
        "## Charts\n\n![latency](latency.svg)\n\n![lag](lag.svg)\n\n![lag heatmap](lag-heatmap.svg)\n\n![topology](topology.svg)\n"
    );
    let _ = writeln!(
        s,
        "Replay: `pangea sim run sim/drills/{}.toml --seed {}`",
        sc.name, r.seed
    );
    s
}

/// Writes `report.json`, `summary.md` and the four SVG charts into `dir`.
pub fn write_report_dir(
    dir: &Path,
    sc: &Scenario,
    description: &str,
    r: &RunReport,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(r)?)?;
    std::fs::write(dir.join("summary.md"), summary_md(sc, description, r))?;
    std::fs::write(dir.join("latency.svg"), latency_svg(r))?;
    std::fs::write(dir.join("lag.svg"), lag_svg(r))?;
    std::fs::write(dir.join("lag-heatmap.svg"), heatmap_svg(r))?;
    let d = &sc.deployment;
    let trees: Vec<_> = d.policies().map(|s| d.tree(s, None)).collect();
    std::fs::write(
        dir.join("topology.svg"),
        pangea_topology::svg::render(d, &trees),
    )?;
    Ok(())
}
