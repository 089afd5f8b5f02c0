//! Drill files (`sim/drills/*.toml`): a deployment, a workload, a fault timeline in
//! operator terms and the expected outcomes.
//!
//! Parse, don't validate: the file deserializes (toml_edit's serde, every table
//! `deny_unknown_fields`) into the raw structs below, then [`Drill::load`] resolves
//! names against the topology and builds a [`Scenario`], reporting every problem at
//! once as `file:line: key: message`. See `docs/drills.md` for the format.

use crate::host::{HostModel, HostPatch, Hosts};
use crate::net::{LinkOverride, NetConfig};
use crate::scenario::{
    Fault, FaultKind, KeyDistribution, ModeMix, RegionLoad, Scenario, Slo, ValueSize, Workload,
    WriteAck,
};
use crate::time::SimDuration;
use crate::workload::VALUE_BYTES_MAX;
use pangea_core::replica::Config as ReplicaConfig;
use pangea_topology::placement::parse_duration_ms;
use pangea_topology::{Deployment, Placement, RegionId, ReplicaId, ScopeId};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One problem in a drill file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrillProblem {
    pub file: PathBuf,
    pub line: Option<usize>,
    /// Dotted key path (`faults[2].region`); empty for the whole file.
    pub key: String,
    pub message: String,
}

impl fmt::Display for DrillProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Every problem found in a drill file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct DrillProblems(pub Vec<DrillProblem>);

impl fmt::Display for DrillProblems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

// ---- the file as written ------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDrill {
    name: Option<String>,
    #[serde(default)]
    description: String,
    topology: String,
    placement: Option<String>,
    /// Run the files' deployment with this many shard groups instead of the
    /// topology file's (docs/sharding.md).
    shard_groups: Option<u32>,
    /// Run every replica as this many processes, each hosting a range of the
    /// shard groups (docs/sharding.md).
    processes: Option<u32>,
    seed: u64,
    duration: String,
    drain_max: Option<String>,
    #[serde(default)]
    clock_skew_ms_max: u64,
    #[serde(default)]
    replica: RawReplica,
    #[serde(default)]
    network: RawNetwork,
    #[serde(default)]
    host: RawHost,
    #[serde(default)]
    workload: RawWorkload,
    #[serde(default)]
    faults: Vec<RawFault>,
    #[serde(default)]
    expect: RawExpect,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplica {
    heartbeat_interval_ms: Option<u64>,
    suspect_after_ms: Option<u64>,
    probe_interval_ms: Option<u64>,
    gap_retry_ms: Option<u64>,
    gap_grace_ms: Option<u64>,
    log_entries_retained_max: Option<u64>,
    max_offset_ms: Option<u64>,
    compaction_interval_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNetwork {
    jitter_fraction: Option<f64>,
    rto_rtt_factor: Option<f64>,
    rto_min_ms: Option<f64>,
    intra_region_bandwidth_mbps: Option<f64>,
}

/// `[host]`: changes to the default host (`crate::host::HostModel`), and
/// `[host.regions.NAME]` / `[host.replicas.ID]` (the same keys, not nested further)
/// for some regions or replicas.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    cores: Option<u32>,
    read_us: Option<f64>,
    write_us: Option<f64>,
    apply_us: Option<f64>,
    per_kib_us: Option<f64>,
    cpu_sigma: Option<f64>,
    commit_us: Option<f64>,
    commit_sigma: Option<f64>,
    overhead_us: Option<u64>,
    /// Share of the cores busy with work not itemized (0 to 0.9).
    background: Option<f64>,
    /// Mean length of one piece of that work, µs (> 0).
    background_us: Option<f64>,
    /// CPU to wake a thread that slept, paid by work that finds it asleep, µs.
    wake_us: Option<f64>,
    /// How much longer the replication driver waits for a core than the serving
    /// threads (1 to 40: the ratio of their scheduler weights).
    driver_wait: Option<f64>,
    /// How often a replica's thread is descheduled, per second at an idle
    /// machine (0 to 1000), and for how long, µs (mean, 1 to 1000000).
    stall_per_s: Option<f64>,
    stall_us: Option<f64>,
    /// Every host on one machine of this many cores (top level only).
    machine_cores: Option<u32>,
    /// The frontends' CPU per request and per answer on that machine (top level,
    /// with `machine_cores`).
    frontend_us: Option<f64>,
    #[serde(default)]
    regions: BTreeMap<String, RawHost>,
    #[serde(default)]
    replicas: BTreeMap<String, RawHost>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMix {
    #[serde(default)]
    read: f64,
    #[serde(default)]
    write: f64,
    #[serde(default)]
    delete: f64,
    #[serde(default)]
    increment: f64,
    #[serde(default)]
    batch: f64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModes {
    #[serde(default)]
    eventual: f64,
    #[serde(default)]
    affinity: f64,
    #[serde(default)]
    watermark: f64,
    #[serde(default)]
    bounded: f64,
    #[serde(default)]
    as_of: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawValueSize {
    /// fixed | uniform | lognormal
    distribution: String,
    bytes: Option<u64>,
    min_bytes: Option<u64>,
    max_bytes: Option<u64>,
    median_bytes: Option<u64>,
    sigma: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRegionLoad {
    region: String,
    clients: Option<u32>,
    rate: Option<f64>,
}

/// `write_ack = "origin" | "all-regions" | N` (N other regions).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawAck {
    Regions(u32),
    Named(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkload {
    rate: Option<f64>,
    clients_per_region: Option<u32>,
    table: Option<String>,
    family: Option<String>,
    /// The counter family the mix's increments go to.
    counter_family: Option<String>,
    /// Rows of each batch write.
    batch_rows: Option<u32>,
    columns: Option<u32>,
    keys: Option<u64>,
    key_distribution: Option<String>,
    zipf_theta: Option<f64>,
    value_size: Option<RawValueSize>,
    mix: Option<RawMix>,
    modes: Option<RawModes>,
    bounded_ms: Option<u64>,
    /// How long before each read as of a time its time is.
    as_of_ms: Option<u64>,
    read_back: Option<f64>,
    write_ack: Option<RawAck>,
    deadline_ms: Option<u64>,
    write_deadline_ms: Option<u64>,
    hedge: Option<bool>,
    app_profile: Option<String>,
    prefixes: Option<BTreeMap<String, String>>,
    global_prefix: Option<String>,
    local_fraction: Option<f64>,
    #[serde(default)]
    regions: Vec<RawRegionLoad>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFault {
    at: String,
    kind: String,
    #[serde(rename = "for")]
    duration: Option<String>,
    label: Option<String>,
    replica: Option<String>,
    replicas: Option<Vec<String>>,
    region: Option<String>,
    regions: Option<Vec<String>>,
    continent: Option<String>,
    /// Sides of a partition or a degraded link: region or continent names.
    a: Option<Vec<String>>,
    b: Option<Vec<String>>,
    one_way: Option<bool>,
    latency_ms: Option<f64>,
    loss: Option<f64>,
    bandwidth_mbps: Option<f64>,
    offset_ms: Option<i64>,
    /// A slow host: how many times slower.
    factor: Option<f64>,
    placement: Option<String>,
    rollout: Option<String>,
    interval: Option<String>,
    down_for: Option<String>,
    /// A placement move: the rows of `table` under `prefix` go to policy `to`.
    table: Option<String>,
    prefix: Option<String>,
    to: Option<String>,
    home: Option<String>,
    /// A backup: the app profile it reads with, the policies it backs up, and
    /// the deadline of each call.
    app_profile: Option<String>,
    policies: Option<Vec<String>>,
    deadline_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExpect {
    #[serde(default)]
    p99_ms: BTreeMap<String, f64>,
    region_p99_ms_max: Option<f64>,
    #[serde(default)]
    read_errors_max: BTreeMap<String, u64>,
    availability_min: Option<f64>,
    replication_lag_ms_max: Option<f64>,
    convergence_ms_max: Option<f64>,
    zero_violations: Option<bool>,
}

// ---- key paths and lines ------------------------------------------------------------

/// The drill file's text, for turning key paths into lines and spans into keys.
struct Source {
    file: PathBuf,
    text: String,
    doc: Option<toml_edit::ImDocument<String>>,
}

use pangea_topology::problems::{Seg, span_start};

fn path_string(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) if s.is_empty() => s += k,
            Seg::Key(k) => {
                s.push('.');
                s += k;
            }
            Seg::Index(i) => s += &format!("[{i}]"),
        }
    }
    s
}

impl Source {
    fn line_at(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())]
            .matches('\n')
            .count()
            + 1
    }

    /// The line of the deepest part of `path` present in the file.
    fn line_of(&self, path: &[Seg]) -> Option<usize> {
        span_start(self.doc.as_ref()?, path).map(|o| self.line_at(o))
    }

    /// The key path of the deepest key or array element whose span holds `offset`.
    fn path_at(&self, offset: usize) -> Vec<Seg> {
        use toml_edit::{Item, Table, Value};
        fn walk_value(v: &Value, offset: usize, path: &mut Vec<Seg>) {
            match v {
                Value::InlineTable(t) => {
                    for (k, v) in t.iter() {
                        if v.span().is_some_and(|s| s.contains(&offset))
                            || t.key(k)
                                .and_then(|k| k.span())
                                .is_some_and(|s| s.contains(&offset))
                        {
                            path.push(Seg::Key(k.to_owned()));
                            walk_value(v, offset, path);
                            return;
                        }
                    }
                }
                Value::Array(a) => {
                    for (i, v) in a.iter().enumerate() {
                        if v.span().is_some_and(|s| s.contains(&offset)) {
                            path.push(Seg::Index(i));
                            walk_value(v, offset, path);
                            return;
                        }
                    }
                }
                _ => {}
            }
        }
        fn walk_table(t: &Table, offset: usize, path: &mut Vec<Seg>) -> bool {
            for (k, item) in t.iter() {
                let key_hit = t
                    .key(k)
                    .and_then(|k| k.span())
                    .is_some_and(|s| s.contains(&offset));
                match item {
                    Item::Value(v) => {
                        if key_hit || v.span().is_some_and(|s| s.contains(&offset)) {
                            path.push(Seg::Key(k.to_owned()));
                            walk_value(v, offset, path);
                            return true;
                        }
                    }
                    Item::Table(sub) => {
                        path.push(Seg::Key(k.to_owned()));
                        if walk_table(sub, offset, path)
                            || key_hit
                            || sub.span().is_some_and(|s| s.contains(&offset))
                        {
                            return true;
                        }
                        path.pop();
                    }
                    Item::ArrayOfTables(a) => {
                        for (i, sub) in a.iter().enumerate() {
                            path.push(Seg::Key(k.to_owned()));
                            path.push(Seg::Index(i));
                            if walk_table(sub, offset, path)
                                || sub.span().is_some_and(|s| s.contains(&offset))
                            {
                                return true;
                            }
                            path.pop();
                            path.pop();
                        }
                    }
                    Item::None => {}
                }
            }
            false
        }
        let mut path = Vec::new();
        if let Some(doc) = &self.doc {
            walk_table(doc.as_table(), offset, &mut path);
        }
        path
    }

    fn problem(&self, path: &[Seg], message: impl Into<String>) -> DrillProblem {
        DrillProblem {
            file: self.file.clone(),
            line: self.line_of(path),
            key: path_string(path),
            message: message.into(),
        }
    }
}

/// A key path: `p!["faults", 2, "region"]`.
macro_rules! p {
    ($($seg:expr),* $(,)?) => {
        [$(Seg::from($seg)),*]
    };
}

// ---- validation -----------------------------------------------------------------------

/// A validated drill: the scenario it runs and what describes it.
#[derive(Debug, Clone)]
pub struct Drill {
    pub file: PathBuf,
    pub description: String,
    pub scenario: Scenario,
}

/// Finds `rel` relative to the working directory or to an ancestor of `base`
/// (drills name files relative to the repository root).
pub fn resolve(base: &Path, rel: &str) -> Option<PathBuf> {
    let p = Path::new(rel);
    if p.is_absolute() {
        return p.exists().then(|| p.to_owned());
    }
    if p.exists() {
        return Some(p.to_owned());
    }
    base.ancestors()
        .map(|a| a.join(p))
        .find(|candidate| candidate.exists())
}

struct Ctx<'a> {
    src: &'a Source,
    d: &'a Deployment,
    problems: Vec<DrillProblem>,
}

impl Ctx<'_> {
    fn err(&mut self, path: &[Seg], message: impl Into<String>) {
        self.problems.push(self.src.problem(path, message));
    }

    fn duration(&mut self, path: &[Seg], s: &str) -> Option<SimDuration> {
        match parse_duration_ms(s) {
            Some(ms) => Some(SimDuration::from_ms(ms)),
            None => {
                self.err(
                    path,
                    format!("invalid duration {s:?} (a number and ms, s, m, h or d)"),
                );
                None
            }
        }
    }

    fn fraction(&mut self, path: &[Seg], x: f64) -> f64 {
        if !(0.0..=1.0).contains(&x) {
            self.err(path, format!("{x} is not a fraction in [0, 1]"));
        }
        x
    }

    fn replica(&mut self, path: &[Seg], id: &str) -> Option<ReplicaId> {
        if self.d.topology.replicas.contains_key(id) {
            Some(ReplicaId::new(id))
        } else {
            self.err(path, format!("unknown replica {id:?}"));
            None
        }
    }

    fn region(&mut self, path: &[Seg], id: &str) -> Option<RegionId> {
        if self.d.topology.regions.contains_key(id) {
            Some(RegionId::new(id))
        } else {
            self.err(path, format!("unknown region {id:?}"));
            None
        }
    }

    /// Region names, or continent names standing for all their regions.
    fn regions_or_continents(&mut self, path: &[Seg], names: &[String]) -> Vec<RegionId> {
        let mut out = BTreeSet::new();
        for (i, n) in names.iter().enumerate() {
            let mut p = path.to_vec();
            p.push(Seg::Index(i));
            if self.d.topology.regions.contains_key(n.as_str()) {
                out.insert(RegionId::new(n.as_str()));
            } else if self.d.topology.continents.iter().any(|c| c == n) {
                out.extend(
                    self.d
                        .topology
                        .regions
                        .values()
                        .filter(|r| &r.continent == n)
                        .map(|r| r.name.clone()),
                );
            } else {
                self.err(&p, format!("{n:?} is neither a region nor a continent"));
            }
        }
        if names.is_empty() {
            self.err(path, "an empty list of regions");
        }
        out.into_iter().collect()
    }
}

impl Drill {
    /// Loads and validates a drill file, with every problem at once.
    pub fn load(file: &Path) -> Result<Drill, DrillProblems> {
        let text = std::fs::read_to_string(file).map_err(|e| {
            DrillProblems(vec![DrillProblem {
                file: file.to_owned(),
                line: None,
                key: String::new(),
                message: format!("cannot read: {e}"),
            }])
        })?;
        Self::parse(file, &text)
    }

    /// Validates drill text; `file` names it in problems and anchors relative paths.
    pub fn parse(file: &Path, text: &str) -> Result<Drill, DrillProblems> {
        let src = Source {
            file: file.to_owned(),
            text: text.to_owned(),
            doc: toml_edit::ImDocument::parse(text.to_owned()).ok(),
        };
        let raw: RawDrill = match toml_edit::de::from_str(text) {
            Ok(r) => r,
            Err(e) => {
                let path = e.span().map(|s| src.path_at(s.start)).unwrap_or_default();
                let line = e.span().map(|s| src.line_at(s.start));
                return Err(DrillProblems(vec![DrillProblem {
                    file: file.to_owned(),
                    line,
                    key: path_string(&path),
                    message: e.message().trim().to_owned(),
                }]));
            }
        };
        let base = file.parent().unwrap_or(Path::new("."));
        let top = |problems: Vec<pangea_topology::Problem>| {
            DrillProblems(
                problems
                    .into_iter()
                    .map(|p| DrillProblem {
                        file: p.file,
                        line: p.line,
                        key: p.key,
                        message: p.message,
                    })
                    .collect(),
            )
        };
        let Some(topology_path) = resolve(base, &raw.topology) else {
            return Err(DrillProblems(vec![src.problem(
                &p!["topology"],
                format!(
                    "no file {:?} under the working directory or the drill's ancestors",
                    raw.topology
                ),
            )]));
        };
        let placement_path = match &raw.placement {
            Some(p) => match resolve(base, p) {
                Some(path) => Some(path),
                None => {
                    return Err(DrillProblems(vec![src.problem(
                        &p!["placement"],
                        format!(
                            "no file {p:?} under the working directory or the drill's ancestors"
                        ),
                    )]));
                }
            },
            None => None,
        };
        let mut d =
            Deployment::load(&topology_path, placement_path.as_deref()).map_err(|p| top(p.0))?;
        if let Some(g) = raw.shard_groups {
            d = d
                .with_shard_groups(g)
                .map_err(|why| DrillProblems(vec![src.problem(&p!["shard_groups"], why)]))?;
        }
        if let Some(n) = raw.processes {
            d.topology = d
                .topology
                .with_processes(n)
                .map_err(|why| DrillProblems(vec![src.problem(&p!["processes"], why)]))?;
        }
        let d = Arc::new(d);
        let mut cx = Ctx {
            src: &src,
            d: &d,
            problems: Vec::new(),
        };
        let name = raw.name.clone().unwrap_or_else(|| {
            file.file_stem()
                .map_or_else(|| "drill".into(), |s| s.to_string_lossy().into_owned())
        });
        let duration = cx
            .duration(&p!["duration"], &raw.duration)
            .unwrap_or(SimDuration::from_secs(60));
        let drain_max = match &raw.drain_max {
            Some(s) => cx
                .duration(&p!["drain_max"], s)
                .unwrap_or(SimDuration::from_secs(60)),
            None => SimDuration::from_secs(60),
        };
        let mut sc = Scenario::new(&name, d.clone(), raw.seed, duration);
        sc.topology_path = raw.topology.clone();
        sc.placement_path = raw.placement.clone();
        sc.drain_max = drain_max;
        sc.clock_skew_ms_max = raw.clock_skew_ms_max;
        sc.replica = replica_config(&raw.replica);
        sc.net = net_config(&mut cx, &raw.network);
        sc.host = hosts(&mut cx, &raw.host);
        sc.workload = workload(&mut cx, &raw.workload);
        for (i, f) in raw.faults.iter().enumerate() {
            let mut faults = fault(&mut cx, i, f, base, duration);
            sc.faults.append(&mut faults);
        }
        sc.slo = expect(&mut cx, &raw.expect);
        if cx.problems.is_empty() {
            Ok(Drill {
                file: file.to_owned(),
                description: raw.description,
                scenario: sc,
            })
        } else {
            Err(DrillProblems(cx.problems))
        }
    }
}

fn replica_config(r: &RawReplica) -> ReplicaConfig {
    let mut c = ReplicaConfig::default();
    let set = |field: &mut u64, v: Option<u64>| {
        if let Some(v) = v {
            *field = v;
        }
    };
    set(&mut c.heartbeat_interval_ms, r.heartbeat_interval_ms);
    set(&mut c.suspect_after_ms, r.suspect_after_ms);
    set(&mut c.probe_interval_ms, r.probe_interval_ms);
    set(&mut c.gap_retry_ms, r.gap_retry_ms);
    set(&mut c.gap_grace_ms, r.gap_grace_ms);
    set(&mut c.log_entries_retained_max, r.log_entries_retained_max);
    set(&mut c.max_offset_ms, r.max_offset_ms);
    set(&mut c.compaction_interval_ms, r.compaction_interval_ms);
    c
}

fn hosts(cx: &mut Ctx<'_>, r: &RawHost) -> Hosts {
    let mut hosts = Hosts {
        default: host_patch(cx, &p!["host"], r).apply_to(HostModel::default()),
        machine_cores: r.machine_cores,
        frontend_us: r.frontend_us.unwrap_or(0.0),
        ..Hosts::default()
    };
    if let Some(f) = r.frontend_us {
        if !(0.0..=1e6).contains(&f) {
            cx.err(
                &p!["host", "frontend_us"],
                format!("must be 0 to 1000000 µs, not {f}"),
            );
        } else if r.machine_cores.is_none() {
            cx.err(
                &p!["host", "frontend_us"],
                "frontends take the replicas' CPU only on a shared machine: set \
                 machine_cores too",
            );
        }
    }
    if let Some(c) = r.machine_cores
        && !(1..=4096).contains(&c)
    {
        cx.err(
            &p!["host", "machine_cores"],
            format!("must be 1 to 4096, not {c}"),
        );
    }
    for (kind, patches) in [("regions", &r.regions), ("replicas", &r.replicas)] {
        for (name, patch) in patches {
            let at = p!["host", kind, name.as_str()];
            let known = match kind {
                "regions" => cx.region(&at, name).is_some(),
                _ => cx.replica(&at, name).is_some(),
            };
            if !patch.regions.is_empty()
                || !patch.replicas.is_empty()
                || patch.machine_cores.is_some()
                || patch.frontend_us.is_some()
            {
                cx.err(
                    &at,
                    "a region's or replica's host takes no regions, replicas, machine_cores \
                     or frontend_us",
                );
            }
            if known {
                let patch = host_patch(cx, &at, patch);
                match kind {
                    "regions" => hosts.regions.insert(name.clone(), patch),
                    _ => hosts.replicas.insert(name.clone(), patch),
                };
            }
        }
    }
    hosts
}

/// One `[host]` table, checked: at least one core, times and spreads finite and
/// not negative.
fn host_patch(cx: &mut Ctx<'_>, at: &[Seg], r: &RawHost) -> HostPatch {
    let field = |k: &'static str| at.iter().cloned().chain([Seg::from(k)]).collect::<Vec<_>>();
    if let Some(c) = r.cores
        && !(1..=4096).contains(&c)
    {
        cx.err(&field("cores"), format!("must be 1 to 4096, not {c}"));
    }
    let mut check = |k: &'static str, v: Option<f64>| {
        if let Some(x) = v
            && !(x.is_finite() && x >= 0.0)
        {
            cx.err(&field(k), format!("must be a finite number ≥ 0, not {x}"));
        }
    };
    check("read_us", r.read_us);
    check("write_us", r.write_us);
    check("apply_us", r.apply_us);
    check("per_kib_us", r.per_kib_us);
    check("cpu_sigma", r.cpu_sigma);
    check("commit_us", r.commit_us);
    check("commit_sigma", r.commit_sigma);
    check("wake_us", r.wake_us);
    if let Some(b) = r.background
        && !(0.0..=0.9).contains(&b)
    {
        cx.err(&field("background"), format!("must be 0 to 0.9, not {b}"));
    }
    if let Some(us) = r.background_us
        && !(us.is_finite() && (1.0..=1_000_000.0).contains(&us))
    {
        cx.err(
            &field("background_us"),
            format!("must be 1 to 1000000 µs, not {us}"),
        );
    }
    if let Some(w) = r.driver_wait
        && !(w.is_finite() && (1.0..=40.0).contains(&w))
    {
        cx.err(&field("driver_wait"), format!("must be 1 to 40, not {w}"));
    }
    if let Some(n) = r.stall_per_s
        && !(n.is_finite() && (0.0..=1000.0).contains(&n))
    {
        cx.err(&field("stall_per_s"), format!("must be 0 to 1000, not {n}"));
    }
    if let Some(us) = r.stall_us
        && !(us.is_finite() && (1.0..=1_000_000.0).contains(&us))
    {
        cx.err(
            &field("stall_us"),
            format!("must be 1 to 1000000 µs, not {us}"),
        );
    }
    HostPatch {
        cores: r.cores,
        read_us: r.read_us,
        write_us: r.write_us,
        apply_us: r.apply_us,
        per_kib_us: r.per_kib_us,
        cpu_sigma: r.cpu_sigma,
        commit_us: r.commit_us,
        commit_sigma: r.commit_sigma,
        overhead_us: r.overhead_us,
        background: r.background,
        background_us: r.background_us,
        wake_us: r.wake_us,
        driver_wait: r.driver_wait,
        stall_per_s: r.stall_per_s,
        stall_us: r.stall_us,
    }
}

fn net_config(cx: &mut Ctx<'_>, r: &RawNetwork) -> NetConfig {
    let mut c = NetConfig::default();
    if let Some(j) = r.jitter_fraction {
        c.jitter_fraction = cx.fraction(&p!["network", "jitter_fraction"], j);
    }
    if let Some(x) = r.rto_rtt_factor {
        c.rto_rtt_factor = x;
    }
    if let Some(x) = r.rto_min_ms {
        c.rto_min_ms = x;
    }
    c.intra_region_bandwidth_mbps = r.intra_region_bandwidth_mbps;
    c
}

fn workload(cx: &mut Ctx<'_>, r: &RawWorkload) -> Workload {
    let d = cx.d;
    let mut w = Workload::ad_serving(d, r.rate.unwrap_or(500.0));
    if let Some(rate) = r.rate
        && !(rate.is_finite() && rate >= 0.0)
    {
        cx.err(&p!["workload", "rate"], "must be a finite number ≥ 0");
    }
    if let Some(t) = &r.table {
        w.table = t.clone();
    }
    if let Some(f) = &r.family {
        w.family = f.clone();
    }
    match d.placement.schema.table(&w.table) {
        None => cx.err(
            &p!["workload", "table"],
            format!("table {:?} is not in the placement", w.table),
        ),
        Some(_) if w.table.starts_with('_') => cx.err(
            &p!["workload", "table"],
            format!(
                "{:?} is a system table (global, whatever the placement's rules): \
                 a workload writes a table of the placement's own",
                w.table
            ),
        ),
        Some(t) if t.family(&w.family).is_none() => cx.err(
            &p!["workload", "family"],
            format!("family {:?} is not in table {:?}", w.family, w.table),
        ),
        Some(_) => {}
    }
    if let Some(c) = r.columns {
        w.columns = c.max(1);
    }
    if let Some(k) = r.keys {
        if k == 0 {
            cx.err(&p!["workload", "keys"], "at least one key");
        }
        w.keys = k.max(1);
    }
    match r.key_distribution.as_deref() {
        None | Some("zipf") => {
            let theta = r.zipf_theta.unwrap_or(0.99);
            if !(theta.is_finite() && theta >= 0.0) {
                cx.err(&p!["workload", "zipf_theta"], "must be ≥ 0");
            }
            w.key_distribution = KeyDistribution::Zipf { theta };
        }
        Some("uniform") => w.key_distribution = KeyDistribution::Uniform,
        Some(other) => cx.err(
            &p!["workload", "key_distribution"],
            format!("{other:?}: expected \"uniform\" or \"zipf\""),
        ),
    }
    if let Some(v) = &r.value_size {
        let path = p!["workload", "value_size"].to_vec();
        let need = |cx: &mut Ctx<'_>, x: Option<u64>, key: &str| -> usize {
            match x {
                Some(n) if n >= 1 && n as usize <= VALUE_BYTES_MAX => n as usize,
                Some(n) => {
                    let mut p = path.clone();
                    p.push(Seg::from(key));
                    cx.err(&p, format!("{n} bytes: values are 1 B to 1 MiB"));
                    1
                }
                None => {
                    cx.err(
                        &path,
                        format!("distribution {:?} needs `{key}`", v.distribution),
                    );
                    1
                }
            }
        };
        w.value_size = match v.distribution.as_str() {
            "fixed" => ValueSize::Fixed(need(cx, v.bytes, "bytes")),
            "uniform" => {
                let (min, max) = (
                    need(cx, v.min_bytes, "min_bytes"),
                    need(cx, v.max_bytes, "max_bytes"),
                );
                if min > max {
                    cx.err(&path, "min_bytes > max_bytes");
                }
                ValueSize::Uniform {
                    min,
                    max: max.max(min),
                }
            }
            "lognormal" => ValueSize::LogNormal {
                median: need(cx, v.median_bytes, "median_bytes"),
                sigma: v.sigma.unwrap_or(1.0),
                max: v
                    .max_bytes
                    .map_or(VALUE_BYTES_MAX, |_| need(cx, v.max_bytes, "max_bytes")),
            },
            other => {
                let mut p = path.clone();
                p.push(Seg::from("distribution"));
                cx.err(
                    &p,
                    format!("{other:?}: expected fixed, uniform or lognormal"),
                );
                w.value_size
            }
        };
    }
    if let Some(m) = &r.mix {
        for (k, x) in [
            ("read", m.read),
            ("write", m.write),
            ("delete", m.delete),
            ("increment", m.increment),
            ("batch", m.batch),
        ] {
            cx.fraction(&p!["workload", "mix", k], x);
        }
        if m.read + m.write + m.delete + m.increment + m.batch <= 0.0 {
            cx.err(
                &p!["workload", "mix"],
                "no operations (all fractions are 0)",
            );
        }
        (w.read, w.write, w.delete, w.increment, w.batch) =
            (m.read, m.write, m.delete, m.increment, m.batch);
    }
    if let Some(n) = r.batch_rows {
        let max = pangea_core::limits::Limits::default().batch_rows_max;
        if n == 0 || n as usize > max {
            cx.err(
                &p!["workload", "batch_rows"],
                format!("{n} rows: a batch write has 1 to {max} (the replicas' batch_rows_max)"),
            );
        }
        w.batch_rows = n;
    }
    if let Some(f) = &r.counter_family {
        w.counter_family = f.clone();
    }
    if w.increment > 0.0 {
        let family = d
            .placement
            .schema
            .table(&w.table)
            .and_then(|t| t.family(&w.counter_family));
        if !family.is_some_and(|f| f.is_counter()) {
            cx.err(
                &p!["workload", "counter_family"],
                format!(
                    "increments need a counter family of table {:?} (`type = \"counter\"` \
                     in the placement); {:?} is not one",
                    w.table, w.counter_family
                ),
            );
        }
    }
    if let Some(m) = &r.modes {
        for (k, x) in [
            ("eventual", m.eventual),
            ("affinity", m.affinity),
            ("watermark", m.watermark),
            ("bounded", m.bounded),
            ("as_of", m.as_of),
        ] {
            cx.fraction(&p!["workload", "modes", k], x);
        }
        if m.eventual + m.affinity + m.watermark + m.bounded + m.as_of <= 0.0 {
            cx.err(
                &p!["workload", "modes"],
                "no read mode (all fractions are 0)",
            );
        }
        w.modes = ModeMix {
            eventual: m.eventual,
            affinity: m.affinity,
            watermark: m.watermark,
            bounded: m.bounded,
            as_of: m.as_of,
        };
    }
    if let Some(b) = r.bounded_ms {
        w.bounded_ms = b;
    }
    if let Some(a) = r.as_of_ms {
        w.as_of_ms = a;
    }
    if let Some(x) = r.read_back {
        cx.fraction(&p!["workload", "read_back"], x);
        w.read_back = x;
    }
    match &r.write_ack {
        None => {}
        Some(RawAck::Regions(0)) => w.write_ack = WriteAck::Origin,
        Some(RawAck::Regions(n)) => w.write_ack = WriteAck::Regions(*n),
        Some(RawAck::Named(s)) => match s.as_str() {
            "origin" => w.write_ack = WriteAck::Origin,
            "all-regions" => w.write_ack = WriteAck::AllRegions,
            other => cx.err(
                &p!["workload", "write_ack"],
                format!("{other:?} is not origin, all-regions or a number of regions"),
            ),
        },
    }
    if let Some(ms) = r.deadline_ms {
        w.deadline = SimDuration::from_ms(ms.max(1));
    }
    if let Some(ms) = r.write_deadline_ms {
        w.write_deadline = SimDuration::from_ms(ms.max(1));
    }
    if let Some(h) = r.hedge {
        w.hedge = h;
    }
    if let Some(a) = &r.app_profile {
        if !d.topology.app_profiles.contains_key(a) && a != "frontend" {
            cx.err(
                &p!["workload", "app_profile"],
                format!("app profile {a:?} is not in the topology"),
            );
        }
        w.app_profile = a.clone();
    }
    if let Some(prefixes) = &r.prefixes {
        for c in prefixes.keys() {
            if !d.topology.continents.contains(c) {
                cx.err(
                    &p!["workload", "prefixes", c.as_str()],
                    format!("unknown continent {c:?}"),
                );
            }
        }
        w.prefixes = prefixes.clone();
    }
    if let Some(g) = &r.global_prefix {
        w.global_prefix = g.clone();
    }
    if let Some(f) = r.local_fraction {
        w.local_fraction = cx.fraction(&p!["workload", "local_fraction"], f);
    }
    if let Some(c) = r.clients_per_region {
        for load in &mut w.regions {
            load.clients = c.max(1);
        }
    }
    for (i, o) in r.regions.iter().enumerate() {
        let Some(region) = cx.region(&p!["workload", "regions", i, "region"], &o.region) else {
            continue;
        };
        let entry = match w.regions.iter_mut().find(|l| l.region == region) {
            Some(e) => e,
            None => {
                w.regions.push(RegionLoad {
                    fill: false,
                    region: region.clone(),
                    clients: r.clients_per_region.unwrap_or(2),
                    rate: 0.0,
                });
                w.regions.last_mut().expect("just pushed")
            }
        };
        if let Some(c) = o.clients {
            entry.clients = c.max(1);
        }
        if let Some(rate) = o.rate {
            if !(rate.is_finite() && rate >= 0.0) {
                cx.err(&p!["workload", "regions", i, "rate"], "must be ≥ 0");
            }
            entry.rate = rate;
        }
    }
    w
}

/// The keys each fault kind takes besides `at`, `kind`, `for` and `label`.
fn allowed_keys(kind: &str) -> Option<&'static [&'static str]> {
    Some(match kind {
        "lose-replica" | "crash-replica" => &["replica", "replicas"],
        "lose-region" | "isolate-region" | "crash-region" => &["region", "regions"],
        "slow-host" => &["replica", "replicas", "region", "factor"],
        "lose-continent" => &["continent"],
        "partition" => &["a", "b", "one_way"],
        "degrade-link" => &["a", "b", "latency_ms", "loss", "bandwidth_mbps"],
        "clock-skew" | "clock-jump" => &["replica", "replicas", "region", "offset_ms"],
        "pause-replica" => &["replica", "replicas"],
        "change-placement" => &["placement", "rollout"],
        "rolling-restart" => &["regions", "interval", "down_for"],
        "migrate" => &["table", "prefix", "to", "home"],
        "backup" => &["region", "app_profile", "policies", "deadline_ms"],
        _ => return None,
    })
}

fn fault(cx: &mut Ctx<'_>, i: usize, f: &RawFault, base: &Path, run: SimDuration) -> Vec<Fault> {
    let here = |k: &str| p!["faults", i, k];
    let Some(keys) = allowed_keys(&f.kind) else {
        cx.err(
            &here("kind"),
            format!(
                "unknown fault kind {:?}; expected lose-replica, lose-region, lose-continent, \
                 crash-replica, crash-region, slow-host, isolate-region, partition, \
                 degrade-link, clock-skew, clock-jump, pause-replica, change-placement, \
                 rolling-restart, migrate or backup",
                f.kind
            ),
        );
        return Vec::new();
    };
    let present: Vec<(&str, bool)> = vec![
        ("replica", f.replica.is_some()),
        ("replicas", f.replicas.is_some()),
        ("region", f.region.is_some()),
        ("regions", f.regions.is_some()),
        ("continent", f.continent.is_some()),
        ("a", f.a.is_some()),
        ("b", f.b.is_some()),
        ("one_way", f.one_way.is_some()),
        ("latency_ms", f.latency_ms.is_some()),
        ("loss", f.loss.is_some()),
        ("bandwidth_mbps", f.bandwidth_mbps.is_some()),
        ("offset_ms", f.offset_ms.is_some()),
        ("factor", f.factor.is_some()),
        ("placement", f.placement.is_some()),
        ("rollout", f.rollout.is_some()),
        ("interval", f.interval.is_some()),
        ("down_for", f.down_for.is_some()),
        ("table", f.table.is_some()),
        ("prefix", f.prefix.is_some()),
        ("to", f.to.is_some()),
        ("home", f.home.is_some()),
        ("app_profile", f.app_profile.is_some()),
        ("policies", f.policies.is_some()),
        ("deadline_ms", f.deadline_ms.is_some()),
    ];
    for (k, there) in present {
        if there && !keys.contains(&k) {
            cx.err(
                &here(k),
                format!(
                    "`{k}` does not apply to kind {:?} (it takes {})",
                    f.kind,
                    keys.join(", ")
                ),
            );
        }
    }
    let at = cx.duration(&here("at"), &f.at).unwrap_or(SimDuration::ZERO);
    if at >= run {
        cx.err(&here("at"), "starts after the drill's duration");
    }
    let duration = f
        .duration
        .as_ref()
        .and_then(|s| cx.duration(&here("for"), s));
    let d = cx.d;
    // Replicas named by `replica`, `replicas` or (clock faults) `region`.
    let replicas = |cx: &mut Ctx<'_>| -> Vec<ReplicaId> {
        let mut out = Vec::new();
        if let Some(r) = &f.replica
            && let Some(id) = cx.replica(&here("replica"), r)
        {
            out.push(id);
        }
        for (j, r) in f.replicas.iter().flatten().enumerate() {
            if let Some(id) = cx.replica(&p!["faults", i, "replicas", j], r) {
                out.push(id);
            }
        }
        if let Some(region) = &f.region
            && let Some(rid) = cx.region(&here("region"), region)
        {
            out.extend(d.topology.regions[&rid].replicas.iter().cloned());
        }
        if out.is_empty() {
            cx.err(
                &here("kind"),
                format!("{} needs `replica` or `replicas`", f.kind),
            );
        }
        out
    };
    let label = |default: String| f.label.clone().unwrap_or(default);
    match f.kind.as_str() {
        "lose-replica" | "crash-replica" => {
            let rs = replicas(cx);
            let silent = f.kind == "lose-replica";
            let verb = if silent { "lose" } else { "crash" };
            let l = label(format!("{verb} {}", names(&rs)));
            vec![Fault {
                at,
                duration,
                kind: FaultKind::Lose {
                    replicas: rs,
                    regions: Vec::new(),
                    silent,
                },
                label: l,
            }]
        }
        "slow-host" => {
            let rs = replicas(cx);
            let factor = match f.factor {
                Some(k) if k.is_finite() && k > 0.0 => k,
                Some(k) => {
                    cx.err(
                        &here("factor"),
                        format!("must be a positive number, not {k}"),
                    );
                    1.0
                }
                None => {
                    cx.err(
                        &here("kind"),
                        "slow-host needs `factor` (e.g. 4: four times slower)",
                    );
                    1.0
                }
            };
            let l = label(format!("slow {} ×{factor}", names(&rs)));
            vec![Fault {
                at,
                duration,
                kind: FaultKind::Slow {
                    replicas: rs,
                    factor,
                },
                label: l,
            }]
        }
        "lose-region" | "isolate-region" | "lose-continent" | "crash-region" => {
            let mut regions: Vec<RegionId> = Vec::new();
            if let Some(r) = &f.region
                && let Some(id) = cx.region(&here("region"), r)
            {
                regions.push(id);
            }
            for (j, r) in f.regions.iter().flatten().enumerate() {
                if let Some(id) = cx.region(&p!["faults", i, "regions", j], r) {
                    regions.push(id);
                }
            }
            if let Some(c) = &f.continent {
                if d.topology.continents.contains(c) {
                    regions.extend(
                        d.topology
                            .regions
                            .values()
                            .filter(|r| &r.continent == c)
                            .map(|r| r.name.clone()),
                    );
                } else {
                    cx.err(&here("continent"), format!("unknown continent {c:?}"));
                }
            }
            if regions.is_empty() {
                cx.err(
                    &here("kind"),
                    format!("{} needs a region or continent", f.kind),
                );
                return Vec::new();
            }
            let what = f.continent.clone().unwrap_or_else(|| names(&regions));
            if f.kind == "isolate-region" {
                let others: Vec<RegionId> = d
                    .topology
                    .regions
                    .keys()
                    .filter(|r| !regions.contains(r))
                    .cloned()
                    .collect();
                let l = label(format!("isolate {what}"));
                return vec![Fault {
                    at,
                    duration,
                    kind: FaultKind::Partition {
                        a: regions,
                        b: others,
                        one_way: false,
                    },
                    label: l,
                }];
            }
            let rs: Vec<ReplicaId> = regions
                .iter()
                .flat_map(|r| d.topology.regions[r].replicas.iter().cloned())
                .collect();
            let l = label(format!("{} {what}", f.kind.replace('-', " ")));
            // A lost region takes its frontends with it; a region whose processes
            // crashed keeps them, and they go elsewhere.
            let silent = f.kind != "crash-region";
            vec![Fault {
                at,
                duration,
                kind: FaultKind::Lose {
                    replicas: rs,
                    regions: if silent { regions } else { Vec::new() },
                    silent,
                },
                label: l,
            }]
        }
        "partition" | "degrade-link" => {
            let (Some(a), Some(b)) = (&f.a, &f.b) else {
                cx.err(&here("kind"), format!("{} needs sides `a` and `b`", f.kind));
                return Vec::new();
            };
            let a = cx.regions_or_continents(&here("a"), a);
            let b = cx.regions_or_continents(&here("b"), b);
            if let Some(both) = a.iter().find(|r| b.contains(r)) {
                cx.err(&here("b"), format!("region {both} is on both sides"));
            }
            let sides = format!("{} | {}", names(&a), names(&b));
            if f.kind == "partition" {
                let one_way = f.one_way.unwrap_or(false);
                let l = label(format!(
                    "partition {}{sides}",
                    if one_way { "one-way " } else { "" }
                ));
                return_fault(at, duration, FaultKind::Partition { a, b, one_way }, l)
            } else {
                let link = LinkOverride {
                    extra_latency_ms: f.latency_ms.unwrap_or(0.0),
                    loss: f.loss.map(|x| cx.fraction(&here("loss"), x)),
                    bandwidth_mbps: f.bandwidth_mbps,
                };
                if let Some(bw) = f.bandwidth_mbps
                    && (bw.is_nan() || bw <= 0.0)
                {
                    cx.err(&here("bandwidth_mbps"), "must be > 0");
                }
                if f.latency_ms.is_some_and(|x| x.is_nan() || x < 0.0) {
                    cx.err(&here("latency_ms"), "must be ≥ 0");
                }
                let l = label(format!("degrade {sides}"));
                return_fault(at, duration, FaultKind::DegradeLink { a, b, link }, l)
            }
        }
        "clock-skew" | "clock-jump" => {
            let rs = replicas(cx);
            let Some(offset_ms) = f.offset_ms else {
                cx.err(&here("kind"), format!("{} needs `offset_ms`", f.kind));
                return Vec::new();
            };
            if f.kind == "clock-jump" && duration.is_some() {
                cx.err(
                    &here("for"),
                    "a clock jump is permanent: use clock-skew for a while",
                );
            }
            let l = label(format!("{} {offset_ms:+} ms {}", f.kind, names(&rs)));
            return_fault(
                at,
                duration,
                FaultKind::ClockSkew {
                    replicas: rs,
                    offset_ms,
                },
                l,
            )
        }
        "pause-replica" => {
            let rs = replicas(cx);
            if duration.is_none() {
                cx.err(&here("for"), "a pause needs `for`");
            }
            let l = label(format!("pause {}", names(&rs)));
            return_fault(at, duration, FaultKind::Pause { replicas: rs }, l)
        }
        "change-placement" => {
            let Some(path) = &f.placement else {
                cx.err(&here("kind"), "change-placement needs `placement`");
                return Vec::new();
            };
            if duration.is_some() {
                cx.err(&here("for"), "a placement change is permanent");
            }
            let rollout = f
                .rollout
                .as_ref()
                .and_then(|s| cx.duration(&here("rollout"), s))
                .unwrap_or(SimDuration::ZERO);
            let Some(file) = resolve(base, path) else {
                cx.err(&here("placement"), format!("no file {path:?}"));
                return Vec::new();
            };
            let placement = match Placement::load(&file, &d.topology) {
                Ok(p) => p,
                Err(problems) => {
                    for pr in problems.0 {
                        cx.problems.push(DrillProblem {
                            file: pr.file,
                            line: pr.line,
                            key: pr.key,
                            message: pr.message,
                        });
                    }
                    return Vec::new();
                }
            };
            let deployment = Arc::new(Deployment {
                topology: d.topology.clone(),
                placement,
            });
            let l = label(format!("placement → {path}"));
            return_fault(
                at,
                None,
                FaultKind::ChangePlacement {
                    deployment,
                    path: path.clone(),
                    rollout,
                },
                l,
            )
        }
        "migrate" => {
            if duration.is_some() {
                cx.err(&here("for"), "a placement move is permanent");
            }
            let (Some(table), Some(prefix), Some(to)) = (&f.table, &f.prefix, &f.to) else {
                cx.err(&here("kind"), "migrate needs `table`, `prefix` and `to`");
                return Vec::new();
            };
            if d.placement.schema.table(table).is_none() {
                cx.err(
                    &here("table"),
                    format!("no table {table:?} in the placement"),
                );
            }
            if d.placement.policy(&ScopeId::from(to.as_str())).is_none() {
                cx.err(&here("to"), format!("no placement policy {to:?}"));
            }
            if let Some(home) = &f.home {
                cx.region(&here("home"), home);
            }
            let l = label(format!("migrate {table}/{prefix} → {to}"));
            return_fault(
                at,
                None,
                FaultKind::Migrate {
                    table: table.clone(),
                    prefix: prefix.clone(),
                    to: to.clone(),
                    home: f.home.clone().unwrap_or_default(),
                },
                l,
            )
        }
        "backup" => {
            if duration.is_some() {
                cx.err(&here("for"), "a backup runs to its end");
            }
            let Some(region) = f
                .region
                .as_ref()
                .and_then(|r| cx.region(&here("region"), r))
            else {
                if f.region.is_none() {
                    cx.err(&here("kind"), "backup needs the `region` it runs in");
                }
                return Vec::new();
            };
            let app_profile = f.app_profile.clone().unwrap_or_else(|| "frontend".into());
            if !d.topology.app_profiles.contains_key(app_profile.as_str()) {
                cx.err(
                    &here("app_profile"),
                    format!("no app profile {app_profile:?} in the topology"),
                );
            }
            let policies = f.policies.clone().unwrap_or_default();
            for (j, p) in policies.iter().enumerate() {
                if !d.placement.policies.contains_key(p.as_str()) {
                    cx.err(
                        &p!["faults", i, "policies", j],
                        format!("no placement policy {p:?}"),
                    );
                }
            }
            let deadline = match f.deadline_ms {
                Some(0) => {
                    cx.err(&here("deadline_ms"), "must be > 0");
                    SimDuration::from_ms(1)
                }
                Some(ms) => SimDuration::from_ms(ms),
                None => SimDuration::from_ms(10_000), // `pangea backup`'s default
            };
            let l = label(format!("backup from {region}"));
            return_fault(
                at,
                None,
                FaultKind::Backup {
                    region,
                    app_profile,
                    policies,
                    deadline,
                },
                l,
            )
        }
        "rolling-restart" => {
            let interval = f
                .interval
                .as_ref()
                .and_then(|s| cx.duration(&here("interval"), s))
                .unwrap_or(SimDuration::from_secs(10));
            let down_for = f
                .down_for
                .as_ref()
                .and_then(|s| cx.duration(&here("down_for"), s))
                .unwrap_or(SimDuration::from_secs(5));
            let mut regions = BTreeSet::new();
            for (j, r) in f.regions.iter().flatten().enumerate() {
                if let Some(id) = cx.region(&p!["faults", i, "regions", j], r) {
                    regions.insert(id);
                }
            }
            let mut out = Vec::new();
            let mut t = at;
            for r in d.topology.replicas.values() {
                if !regions.is_empty() && !regions.contains(&r.region) {
                    continue;
                }
                if t >= run {
                    break;
                }
                out.push(Fault {
                    at: t,
                    duration: Some(down_for),
                    kind: FaultKind::Lose {
                        replicas: vec![r.id.clone()],
                        regions: Vec::new(),
                        silent: false,
                    },
                    label: format!("restart {}", r.id),
                });
                t += interval;
            }
            out
        }
        // `allowed_keys` refused every other kind above.
        _ => Vec::new(),
    }
}

fn return_fault(
    at: SimDuration,
    duration: Option<SimDuration>,
    kind: FaultKind,
    label: String,
) -> Vec<Fault> {
    vec![Fault {
        at,
        duration,
        kind,
        label,
    }]
}

pub(crate) fn names<T: fmt::Display>(ids: &[T]) -> String {
    let v: Vec<String> = ids.iter().map(ToString::to_string).collect();
    if v.len() > 4 {
        format!("{}, … ({} in all)", v[..3].join(", "), v.len())
    } else {
        v.join(", ")
    }
}

fn expect(cx: &mut Ctx<'_>, e: &RawExpect) -> Slo {
    for (key, modes) in [
        ("p99_ms", e.p99_ms.keys().collect::<Vec<_>>()),
        ("read_errors_max", e.read_errors_max.keys().collect()),
    ] {
        for m in modes {
            if !["eventual", "affinity", "watermark", "bounded", "as_of"].contains(&m.as_str()) {
                cx.err(
                    &p!["expect", key, m.as_str()],
                    "unknown mode; expected eventual, affinity, watermark, bounded or as_of",
                );
            }
        }
    }
    if let Some(a) = e.availability_min {
        cx.fraction(&p!["expect", "availability_min"], a);
    }
    if e.zero_violations == Some(false) {
        cx.err(
            &p!["expect", "zero_violations"],
            "invariants cannot be waived: lost writes, watermark and token violations and \
             residency leaks always fail a drill",
        );
    }
    Slo {
        p99_ms: e.p99_ms.clone(),
        region_p99_ms_max: e.region_p99_ms_max,
        read_errors_max: e.read_errors_max.clone(),
        availability_min: e.availability_min,
        replication_lag_ms_max: e.replication_lag_ms_max,
        convergence_ms_max: e.convergence_ms_max,
    }
}

/// The drill files of a directory (`*.toml`, except `*.placement.toml` and
/// `*.topology.toml`, which drills refer to), sorted.
pub fn drill_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            name.ends_with(".toml")
                && !name.ends_with(".placement.toml")
                && !name.ends_with(".topology.toml")
        })
        .collect();
    out.sort();
    Ok(out)
}
