//! The end of a run: C1 over the acknowledged writes, SLOs, and the report.

use super::*;

impl Simulation {
    /// C1: every acknowledged write is applied at every replica that stores its
    /// scope (a watermark covers a whole prefix of its stream, so the highest
    /// acknowledged sequence per stream is enough).
    pub(super) fn final_checks(&mut self) {
        self.unfinished_backups();
        let gaps = self.acked_gaps();
        self.report_acked_gaps(&gaps);
        if self.checks.counted.is_empty() {
            return;
        }
        let counted = std::mem::take(&mut self.checks.counted);
        let oracle = std::mem::take(&mut self.checks.oracle);
        self.check_counters(&counted, &oracle);
        (self.checks.counted, self.checks.oracle) = (counted, oracle);
    }

    /// C8: every replica (run here) that holds a counter's row counts at least
    /// the increments acknowledged to it (over every shard's clients,
    /// `counted`) that no durable delete removed and no TTL expired (`oracle`:
    /// every durable write). More is allowed — an increment whose
    /// acknowledgement was lost still counts — and C5 holds each replica to the
    /// oracle's exact sum.
    pub(super) fn check_counters(
        &mut self,
        counted: &checks::Counted,
        oracle: &BTreeMap<(Arc<str>, Bytes), RowState>,
    ) {
        let d = self.views[self.client_view].clone();
        let now_ms = self.now_wall_ms();
        let location = self.oracle_digests(oracle).1;
        let mut found = Vec::new();
        for ((table, key, family, column), increments) in counted {
            let Some(s) = self.scope_index(&location, table, key) else {
                continue;
            };
            let ttl = d
                .placement
                .schema
                .table(table)
                .and_then(|t| t.family(family))
                .and_then(|f| f.ttl_ms);
            let bucket = pangea_core::row::COUNTER_BUCKET_MS;
            let row = oracle.get(&(table.clone(), key.clone()));
            // Sums as replicas keep them: wrapping at 64 bits.
            let want = increments
                .iter()
                .filter(|(v, _)| !row.is_some_and(|r| r.deletes(family, column, v)))
                .filter(|(v, _)| {
                    ttl.is_none_or(|ttl| {
                        v.timestamp.wall_ms() / bucket * bucket + bucket + ttl > now_ms
                    })
                })
                .fold(0i64, |sum, (_, delta)| sum.wrapping_add(*delta));
            let want = &want;
            let filter = pangea_core::ReadFilter {
                columns: vec![(family.clone(), column.clone())],
                ..Default::default()
            };
            for (r, node) in self.nodes.iter().enumerate() {
                if !node.stores_rows || node.foreign || !self.allowed[self.client_view][s][r] {
                    continue;
                }
                let Some(rep) = node.replica.as_ref() else {
                    continue;
                };
                let got = rep
                    .storage()
                    .get_row(table, key)
                    .ok()
                    .flatten()
                    .and_then(|row| row.read(key, &filter, d.placement.schema.table(table), now_ms))
                    .and_then(|row| row.families.into_iter().flat_map(|f| f.cells).next())
                    .map_or(0, |c| pangea_core::row::count_of(&c.value));
                if got < *want {
                    found.push((
                        want.wrapping_sub(got).unsigned_abs(),
                        format!(
                            "C8: {} counts {got} on {}/{:?}/{family}:{:?}, {want} increments acknowledged",
                            node.id,
                            table,
                            String::from_utf8_lossy(key),
                            String::from_utf8_lossy(column)
                        ),
                    ));
                }
            }
        }
        for (lost, v) in found {
            self.checks.lost_increments += lost;
            self.checks.violation(v);
        }
    }

    /// Per stream (`scope × replicas + origin`): the replica (run here) furthest
    /// behind the highest acknowledged sequence, how far, and where it stands.
    pub(super) fn acked_gaps(&self) -> Vec<Option<(u64, ReplicaId, u64)>> {
        let n = self.names.len();
        let mut gaps = vec![None; self.scopes.len() * n];
        for (s, scope) in self.scope_ids.iter().enumerate() {
            for o in 0..n {
                let acked = self.checks.acked_max[s * n + o];
                if acked == 0 {
                    continue;
                }
                for (r, node) in self.nodes.iter().enumerate() {
                    if !node.stores_rows || node.foreign || !self.allowed[self.client_view][s][r] {
                        continue;
                    }
                    let have = node
                        .replica
                        .as_ref()
                        .and_then(|rep| rep.watermarks(scope))
                        .map_or(0, |w| w.get(&self.nodes[o].id).sequence);
                    let missing = acked.saturating_sub(have);
                    if missing > gaps[s * n + o].as_ref().map_or(0, |g: &(u64, _, _)| g.0) {
                        gaps[s * n + o] = Some((missing, node.id.clone(), have));
                    }
                }
            }
        }
        gaps
    }

    /// C1 for the gaps [`Self::acked_gaps`] found (over every shard, in a split run):
    /// each stream's largest counts as lost writes.
    pub(super) fn report_acked_gaps(&mut self, gaps: &[Option<(u64, ReplicaId, u64)>]) {
        let n = self.names.len();
        for (i, gap) in gaps.iter().enumerate() {
            let Some((missing, id, have)) = gap else {
                continue;
            };
            let (scope, origin) = (self.scopes.name(i / n), self.names.name(i % n));
            let acked = self.checks.acked_max[i];
            self.checks.lost_writes += missing;
            self.checks.violation(format!(
                "C1: {id} has {scope}/{origin} at #{have}, acknowledged up to #{acked}"
            ));
        }
    }

    fn lag_summary(&self) -> LagSummary {
        let h = &self.metrics.lag;
        let q = |p: f64| {
            if h.is_empty() {
                0.0
            } else {
                h.value_at_quantile(p) as f64 / 1_000.0
            }
        };
        LagSummary {
            count: h.len(),
            p50: q(0.5),
            p99: q(0.99),
            max: if h.is_empty() {
                0.0
            } else {
                h.max() as f64 / 1_000.0
            },
        }
    }

    pub(super) fn report(mut self, wall_s: f64) -> RunReport {
        let virtual_s = self.now.as_secs_f64();
        let mut stats = self.net.stats();
        if let Some(other) = self.net_absorbed.take() {
            stats.absorb(other);
        }
        let wan_bytes = WanBytes {
            intra_region: stats.sent.get(LinkClass::IntraRegion).bytes,
            inter_region: stats.sent.get(LinkClass::InterRegion).bytes,
            inter_continent: stats.sent.get(LinkClass::InterContinent).bytes,
            client_cross_region: self.metrics.client_cross_region_bytes,
        };
        self.metrics.counters.network_in_flight_max = stats.in_flight_max;
        let reads_by_mode: BTreeMap<String, _> = Mode::ALL
            .iter()
            .map(|m| {
                (
                    m.as_str().to_owned(),
                    self.metrics.modes[m.index()].summary(),
                )
            })
            .collect();
        let reads = {
            let mut all = metrics::OpStats::default();
            for m in &self.metrics.modes {
                all.absorb(m);
            }
            all.summary()
        };
        let reads_by_region: BTreeMap<String, _> = self
            .net
            .regions()
            .iter()
            .enumerate()
            .filter(|(i, _)| self.metrics.regions[*i].count > 0)
            .map(|(i, r)| (r.to_string(), self.metrics.regions[i].summary()))
            .collect();
        let reads_by_region_mode: BTreeMap<String, BTreeMap<String, _>> = self
            .net
            .regions()
            .iter()
            .enumerate()
            .filter(|(i, _)| self.metrics.regions[*i].count > 0)
            .map(|(i, r)| {
                let modes = Mode::ALL
                    .iter()
                    .filter(|m| self.metrics.region_modes[i][m.index()].count > 0)
                    .map(|m| {
                        (
                            m.as_str().to_owned(),
                            self.metrics.region_modes[i][m.index()].summary(),
                        )
                    })
                    .collect();
                (r.to_string(), modes)
            })
            .collect();
        let availability = if self.metrics.reads == 0 {
            1.0
        } else {
            self.metrics.reads_ok as f64 / self.metrics.reads as f64
        };
        let lag = self.lag_summary();
        let convergence_ms = self
            .catch_up
            .as_ref()
            .and_then(|c| c.done_at.map(|t| t.saturating_since(c.heal_at).as_ms_f64()));
        let final_convergence_ms = match (self.drain_started, self.final_convergence) {
            (Some(a), Some(b)) => Some(b.saturating_since(a).as_ms_f64()),
            _ => None,
        };
        let faults = self
            .sc
            .faults
            .iter()
            .map(|f| FaultMarker {
                label: f.label.clone(),
                start_s: f.at.as_secs_f64(),
                end_s: f
                    .duration
                    .map(|d| (f.at + d).as_secs_f64().min(self.sc.duration.as_secs_f64())),
            })
            .collect();
        let bucket_s = self.metrics.bucket_us as f64 / 1e6;
        let last_bucket = (self.now.as_us() / self.metrics.bucket_us) as usize;
        let series_by_region = self
            .net
            .regions()
            .iter()
            .enumerate()
            .filter(|(i, _)| self.metrics.regions[*i].count > 0)
            .map(|(i, r)| {
                let pts = self.metrics.series[i]
                    .iter()
                    .take(last_bucket + 1)
                    .enumerate()
                    .map(|(b, x)| SeriesPoint {
                        t_s: b as f64 * bucket_s,
                        reads: x.reads.count() + x.read_errors,
                        errors: x.read_errors,
                        p50_ms: x.reads.quantile_us(0.5) as f64 / 1_000.0,
                        p99_ms: x.reads.quantile_us(0.99) as f64 / 1_000.0,
                        write_errors: x.write_errors,
                        hedges: x.hedges,
                        failovers: x.failovers,
                    })
                    .collect();
                (r.to_string(), pts)
            })
            .collect();
        let lag_series = self
            .metrics
            .lag_series
            .iter()
            .take(last_bucket + 1)
            .enumerate()
            .map(|(b, bins)| {
                (
                    b as f64 * bucket_s,
                    bins.quantile_us(0.99) as f64 / 1_000.0,
                    bins.max_us() as f64 / 1_000.0,
                )
            })
            .collect();
        let n = self.names.len();
        let lag_matrix_ids: Vec<String> = (0..n).map(|i| self.names.name(i).to_owned()).collect();
        let lag_matrix = |q: f64| -> Vec<Vec<Option<f64>>> {
            (0..n)
                .map(|o| {
                    (0..n)
                        .map(|r| {
                            let b = &self.metrics.lag_matrix[o * n + r];
                            (b.count() > 0).then(|| b.quantile_us(q) as f64 / 1_000.0)
                        })
                        .collect()
                })
                .collect()
        };
        let (lag_matrix_p99_ms, lag_matrix_p50_ms) = (lag_matrix(0.99), lag_matrix(0.5));
        let over = SimDuration::from_us(self.now.as_us());
        let hosts = self
            .nodes
            .iter()
            .map(|node| {
                let (cpu, disk) = node.host.utilization(over);
                let load = metrics::HostLoad {
                    cpu,
                    driver: node.host.driver_busy.as_us() as f64 / over.as_us().max(1) as f64,
                    disk,
                    fsyncs: node.host.fsyncs,
                    work: node.host.work_shares(over),
                };
                (node.id.to_string(), load)
            })
            .chain(
                self.nodes
                    .first()
                    .and_then(|n| n.host.cores().machine_background_busy())
                    .filter(|b| *b > SimDuration::ZERO)
                    .map(|b| {
                        let cores = self.sc.host.machine_cores.unwrap_or(1).max(1) as f64;
                        let load = metrics::HostLoad {
                            cpu: b.as_us() as f64 / (over.as_us().max(1) as f64 * cores),
                            driver: 0.0,
                            disk: 0.0,
                            fsyncs: 0,
                            work: BTreeMap::new(),
                        };
                        (metrics::BACKGROUND.to_owned(), load)
                    }),
            )
            .chain(self.frontends.as_ref().map(|f| {
                let (cpu, _) = f.utilization(over);
                let load = metrics::HostLoad {
                    cpu,
                    driver: 0.0,
                    disk: 0.0,
                    fsyncs: 0,
                    // Its pieces are the messages the frontends sent and took.
                    work: f.work_shares(over),
                };
                (metrics::FRONTENDS.to_owned(), load)
            }))
            .collect();
        let mut report = RunReport {
            hosts,
            recorded_reads: std::mem::take(&mut self.recorded_reads),
            migrations: self.migrations.clone(),
            backups: self.backup_summaries.clone(),
            drill: self.sc.name.clone(),
            seed: self.sc.seed,
            topology: self.sc.topology_path.clone(),
            placement: self.sc.placement_path.clone(),
            replicas: n,
            virtual_s,
            wall_s,
            speedup: if wall_s > 0.0 {
                virtual_s / wall_s
            } else {
                0.0
            },
            cpu_s: None,
            speedup_cpu: None,
            trace_hash: format!("{:016x}", self.trace.0.digest()),
            operations: self.metrics.reads + self.metrics.writes.count + self.metrics.batches.count,
            reads,
            reads_by_mode,
            reads_by_region,
            reads_by_region_mode,
            writes: self.metrics.writes.summary(),
            batches: self.metrics.batches.summary(),
            availability,
            replication_lag_ms: lag,
            wan_bytes,
            convergence_ms,
            final_convergence_ms,
            lost_writes: self.checks.lost_writes,
            lost_increments: self.checks.lost_increments,
            watermark_violations: self.checks.watermark_violations,
            token_violations: self.checks.token_violations,
            staleness_violations: self.checks.staleness_violations,
            residency_leak_bytes: self.leak_bytes,
            violations: std::mem::take(&mut self.checks.violations),
            slo_failures: Vec::new(),
            faults,
            counters: std::mem::take(&mut self.metrics.counters),
            series_by_region,
            lag_series,
            lag_matrix_ids,
            lag_matrix_p99_ms,
            lag_matrix_p50_ms,
            peak_rss_mib: None,
            shards: 1,
            lookahead_ms: None,
        };
        report.counters.messages_delivered = stats.delivered.messages;
        report.slo_failures = evaluate_slo(&self.sc.slo, &report, self.checks.other_violations);
        report
    }
}

/// Compares a report with the scenario's expected outcomes.
pub(crate) fn evaluate_slo(
    slo: &crate::scenario::Slo,
    r: &RunReport,
    other_violations: u64,
) -> Vec<String> {
    let mut out = Vec::new();
    for (mode, bound) in &slo.p99_ms {
        if let Some(s) = r.reads_by_mode.get(mode)
            && s.count > s.errors
            && s.p99_ms > *bound
        {
            out.push(format!(
                "p99 of {mode} reads is {:.2} ms, above {bound} ms",
                s.p99_ms
            ));
        }
    }
    if let Some(bound) = slo.region_p99_ms_max {
        for (region, modes) in &r.reads_by_region_mode {
            for (mode, s) in modes {
                if s.count > s.errors && s.p99_ms > bound {
                    out.push(format!(
                        "p99 of {mode} reads in {region} is {:.2} ms, above {bound} ms",
                        s.p99_ms
                    ));
                }
            }
        }
    }
    for (mode, max) in &slo.read_errors_max {
        let errors = r.reads_by_mode.get(mode).map_or(0, |s| s.errors);
        if errors > *max {
            out.push(format!("{errors} {mode} reads failed, above {max}"));
        }
    }
    if let Some(min) = slo.availability_min
        && r.availability < min
    {
        out.push(format!("availability {:.5} below {min}", r.availability));
    }
    if let Some(max) = slo.replication_lag_ms_max
        && r.replication_lag_ms.max > max
    {
        out.push(format!(
            "replication lag reached {:.1} ms, above {max} ms",
            r.replication_lag_ms.max
        ));
    }
    if let Some(max) = slo.convergence_ms_max {
        match r.convergence_ms {
            Some(c) if c > max => out.push(format!("convergence took {c:.1} ms, above {max} ms")),
            None => out.push("never caught up after the last heal".into()),
            _ => {}
        }
    }
    // Invariants are not negotiable: a violation fails the run whatever the SLOs say.
    if r.lost_writes > 0 {
        out.push(format!("{} acknowledged writes lost (C1)", r.lost_writes));
    }
    if r.lost_increments > 0 {
        out.push(format!(
            "{} acknowledged increments not counted (C8)",
            r.lost_increments
        ));
    }
    if r.watermark_violations > 0 {
        out.push(format!(
            "{} watermark violations (C2/C3)",
            r.watermark_violations
        ));
    }
    if r.token_violations > 0 {
        out.push(format!("{} token violations (C4)", r.token_violations));
    }
    if r.staleness_violations > 0 {
        out.push(format!(
            "{} bounded reads staler than promised (C7)",
            r.staleness_violations
        ));
    }
    if r.residency_leak_bytes > 0 {
        out.push(format!(
            "{} bytes leaked outside their placement policy (I10)",
            r.residency_leak_bytes
        ));
    }
    if r.final_convergence_ms.is_none() || other_violations > 0 {
        out.push(format!(
            "replicas did not converge or another checker failed (C5): {}",
            r.violations
                .iter()
                .find(|v| v.starts_with("C5") || !v.starts_with('C'))
                .cloned()
                .unwrap_or_default()
        ));
    }
    out
}
