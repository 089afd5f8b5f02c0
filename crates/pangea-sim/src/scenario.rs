//! What one simulation runs: the deployment, the workload, the fault timeline and
//! the expected outcomes, as plain validated data. Drill files ([`crate::drill`])
//! and the swarm ([`crate::swarm`]) both build a [`Scenario`]; the driver
//! ([`crate::sim`]) only ever sees this form.

use crate::net::{LinkOverride, NetConfig};
use crate::time::SimDuration;
use pangea_core::replica::Config as ReplicaConfig;
use pangea_topology::{Deployment, RegionId, ReplicaId};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One run, fully specified: a function of this and nothing else.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// A name for reports (the drill file's stem, or `swarm-<seed>`).
    pub name: String,
    pub seed: u64,
    pub deployment: Arc<Deployment>,
    /// Where the deployment came from, for reports (relative to the repo root).
    pub topology_path: String,
    pub placement_path: Option<String>,
    /// How long the workload runs (the safety phase: faults happen inside it).
    pub duration: SimDuration,
    /// Operations that start before this are neither counted nor measured (a
    /// capacity step's steady state, `crate::capacity`). Default zero.
    pub warmup: SimDuration,
    /// After the workload stops every fault is healed and the run waits, at most
    /// this long, for every replica to converge (the liveness phase; C5).
    pub drain_max: SimDuration,
    pub net: NetConfig,
    pub replica: ReplicaConfig,
    /// What each replica's host costs beyond the network: its cores, service
    /// times and disk ([`crate::host`]).
    pub host: Hosts,
    /// Static wall-clock skew of each replica, drawn uniformly from
    /// `[-clock_skew_ms_max, +clock_skew_ms_max]` at the start.
    pub clock_skew_ms_max: u64,
    pub workload: Workload,
    pub faults: Vec<Fault>,
    pub slo: Slo,
}

pub use crate::host::{HostModel, HostPatch, Hosts};

/// How keys are drawn from the key space.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyDistribution {
    Uniform,
    /// Zipf over key ranks with exponent `theta` (0.99 is the YCSB default).
    Zipf {
        theta: f64,
    },
}

/// How large a written value is, in bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ValueSize {
    Fixed(usize),
    Uniform {
        min: usize,
        max: usize,
    },
    /// Log-normal around `median`, clamped to `[1, max]`: profile sizes are
    /// heavy-tailed (p99 under 1 MB in the brief).
    LogNormal {
        median: usize,
        sigma: f64,
        max: usize,
    },
}

impl ValueSize {
    /// The largest value this distribution can produce.
    pub fn max_bytes(&self) -> usize {
        match *self {
            ValueSize::Fixed(n) => n,
            ValueSize::Uniform { max, .. } | ValueSize::LogNormal { max, .. } => max,
        }
    }
}

/// Fractions of reads by consistency mode (normalized when used).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModeMix {
    pub eventual: f64,
    pub affinity: f64,
    /// Read-your-writes: the key and token of the client's last write.
    pub watermark: f64,
    pub bounded: f64,
    /// Reads as of a time `Workload::as_of_ms` before the read.
    pub as_of: f64,
}

/// When a write is acknowledged, as `pangea_client::Ack` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteAck {
    /// Once durable at its origin (default).
    #[default]
    Origin,
    /// Once replicas in this many other regions have durably applied it.
    Regions(u32),
    /// Once every region of the row's placement policy has.
    AllRegions,
}

/// Load from one region's frontends.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionLoad {
    pub region: RegionId,
    /// Frontend processes, each with its own client-library state (round-trip
    /// estimates, known watermarks, hedge budget, last write token).
    pub clients: u32,
    /// Operations per second from this region (a Poisson process).
    pub rate: f64,
    /// Before its mix, the region's frontends write every row of their key
    /// prefix and of the global prefix once, in key order (each operation a
    /// write of the next row, at the region's rate): a capacity step then
    /// measures a key set already at its steady size (`sim capacity --fill`).
    pub fill: bool,
}

/// The client workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub table: String,
    pub family: String,
    /// Columns written, `c0..c{columns-1}`.
    pub columns: u32,
    /// Distinct keys per key prefix.
    pub keys: u64,
    pub key_distribution: KeyDistribution,
    pub value_size: ValueSize,
    /// Fractions of operations (normalized): reads, cell writes, row deletes,
    /// `+1` increments of a counter (`counter_family`, column
    /// `c0..c{columns-1}`) and batch writes.
    pub read: f64,
    pub write: f64,
    pub delete: f64,
    pub increment: f64,
    /// Batch writes (`MutateRows`): `batch_rows` cell writes of rows of one key
    /// prefix in one request, each row atomic, the batch not.
    pub batch: f64,
    /// Rows of a batch write.
    pub batch_rows: u32,
    /// The counter family increments go to (a family of `type = "counter"` of
    /// the table); empty when the mix has no increments.
    pub counter_family: String,
    pub modes: ModeMix,
    /// The bound of bounded-staleness reads.
    pub bounded_ms: u64,
    /// How long before the read the time of a read as of a time is.
    pub as_of_ms: u64,
    /// Fraction of acknowledged writes the writing frontend reads back at once
    /// with a row-affinity read and no token (it updates a profile and serves
    /// from it). The run counts the read-backs answered by a replica that had
    /// not applied the write (`counters.read_backs_stale`): none while the
    /// row's affinity replica is up when the app profile writes there
    /// (`writes = "row-affinity"`). Default 0.
    pub read_back: f64,
    /// When writes are acknowledged (default: at their origin).
    pub write_ack: WriteAck,
    pub deadline: SimDuration,
    pub write_deadline: SimDuration,
    pub hedge: bool,
    /// The first this many reads keep a record of their call's decisions
    /// (`RunReport::recorded_reads`, for replay tests). Default 0.
    pub record_reads: usize,
    /// The app profile every client acts for.
    pub app_profile: String,
    /// Key prefix of each continent's users (`eu/`, `apac/`, `us/`): placement rules
    /// route rows by prefix. Continents not listed use `global_prefix`.
    pub prefixes: BTreeMap<String, String>,
    /// Prefix of keys every region reads (rows of the global scope).
    pub global_prefix: String,
    /// Fraction of operations on the client's own continent's keys; the rest go to
    /// global keys.
    pub local_fraction: f64,
    pub regions: Vec<RegionLoad>,
}

impl Workload {
    /// Operations per second over all regions.
    pub fn total_rate(&self) -> f64 {
        self.regions.iter().map(|r| r.rate).sum()
    }
}

/// A fault on the timeline.
#[derive(Debug, Clone)]
pub struct Fault {
    /// When it starts, from the start of the run.
    pub at: SimDuration,
    /// How long it lasts; `None`: until the end of the safety phase.
    pub duration: Option<SimDuration>,
    pub kind: FaultKind,
    /// How reports name it (`lose-region eu-west-1`).
    pub label: String,
}

/// Faults in operator terms, resolved to replicas and regions.
#[derive(Debug, Clone)]
pub enum FaultKind {
    /// Stop these replicas' processes (unsynced writes lost) and restart them from
    /// their storage when the fault ends. Losing a region or a continent also stops
    /// its frontends.
    Lose {
        replicas: Vec<ReplicaId>,
        /// Regions whose frontends stop issuing while the fault lasts.
        regions: Vec<RegionId>,
        /// The host is gone (power, network): requests, probes and frames to it
        /// vanish and are found out by timeouts, hedges and suspicion. Otherwise
        /// only the process crashed: its host refuses connections at once.
        silent: bool,
    },
    /// Make these replicas' hosts `factor` times slower (every service time, the
    /// disk's and the request overhead) while the fault lasts.
    Slow {
        replicas: Vec<ReplicaId>,
        factor: f64,
    },
    /// Cut traffic from every region of `a` to every region of `b` (and back unless
    /// `one_way`): replication and client requests alike.
    Partition {
        a: Vec<RegionId>,
        b: Vec<RegionId>,
        one_way: bool,
    },
    /// Change every link between a region of `a` and a region of `b`.
    DegradeLink {
        a: Vec<RegionId>,
        b: Vec<RegionId>,
        link: LinkOverride,
    },
    /// Shift these replicas' wall clocks by `offset_ms` (on top of their static
    /// skew) while the fault lasts: a step, so with no duration it is a jump.
    ClockSkew {
        replicas: Vec<ReplicaId>,
        offset_ms: i64,
    },
    /// Stop delivering to these replicas and stop their timers; on resume, what was
    /// held is delivered in order and timers fire late.
    Pause { replicas: Vec<ReplicaId> },
    /// Hand a new deployment (a changed placement) to every replica via
    /// `handle_view`, one at a time over `rollout`, in an order drawn from the seed;
    /// clients switch when the rollout starts. Permanent.
    ChangePlacement {
        deployment: Arc<Deployment>,
        path: String,
        rollout: SimDuration,
    },
    /// An operator's placement move (`pangea placement move`): a migration job
    /// (`pangea_core::migration::Job`) moving the rows of `table` under `prefix` to
    /// policy `to`, run by the replica the node would pick
    /// (`migration::runner_for`) and stepped by its driver here. Permanent.
    Migrate {
        table: String,
        prefix: String,
        to: String,
        /// The rows' new home region (empty: kept where the policy has it).
        home: String,
    },
    /// An operator's backup (`pangea backup create --region R --app-profile P`,
    /// `pangea_ops::backup`): run from `region`, each scope read from the nearest
    /// replica the profile may use, failing over to the next when a call is
    /// refused or passes `deadline` (`sim/backup.rs`). Permanent: it runs to its
    /// end, and the run waits for it.
    Backup {
        region: RegionId,
        app_profile: String,
        /// Only scopes of these placement policies (empty: every policy the
        /// region may store).
        policies: Vec<String>,
        deadline: SimDuration,
    },
}

/// Expected outcomes; a violated one is listed in `slo_failures`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Slo {
    /// p99 read latency bound per mode (`eventual`, `affinity`, `watermark`,
    /// `bounded`), over answered reads.
    pub p99_ms: BTreeMap<String, f64>,
    /// p99 read latency bound for every client region and mode (over answered
    /// reads): the SLO a frontend in each region sees.
    pub region_p99_ms_max: Option<f64>,
    /// Most failed reads per mode (`bounded = 0`: no bounded-staleness read may
    /// fail, whatever the faults).
    pub read_errors_max: BTreeMap<String, u64>,
    /// Least fraction of reads answered correctly within their deadline.
    pub availability_min: Option<f64>,
    /// Largest replication lag any replica may show.
    pub replication_lag_ms_max: Option<f64>,
    /// Longest catch-up after the last heal.
    pub convergence_ms_max: Option<f64>,
    // Checker violations, lost writes and residency leaks always fail a run: they
    // are invariants, not objectives.
}

impl Workload {
    /// A read-heavy ad-serving mix on `deployment`: the first table of the
    /// placement's own (not a system table such as `_jobs`, which sorts first and
    /// is global whatever the rules say) and its first family, Zipf(0.99) keys,
    /// 1 KiB values, 94 % reads, 5 % writes, 1 % deletes, mostly eventual reads,
    /// `rate` operations per second spread over the regions in proportion to their
    /// serving replicas, two frontends per region.
    pub fn ad_serving(deployment: &Deployment, rate: f64) -> Workload {
        let schema = &deployment.placement.schema;
        let (table, family) = schema
            .tables
            .iter()
            .find(|(t, _)| !t.starts_with('_'))
            .map(|(t, s)| {
                (
                    t.to_string(),
                    s.families
                        .keys()
                        .next()
                        .map_or_else(|| "f".to_owned(), |f| f.to_string()),
                )
            })
            .unwrap_or_else(|| ("t".to_owned(), "f".to_owned()));
        let serving: Vec<(RegionId, usize)> = deployment
            .topology
            .regions
            .values()
            .map(|r| {
                let n = r
                    .replicas
                    .iter()
                    .filter(|id| {
                        deployment.topology.replicas[*id].role == pangea_topology::Role::Serving
                    })
                    .count();
                (r.name.clone(), n)
            })
            .collect();
        let total: usize = serving.iter().map(|(_, n)| n).sum::<usize>().max(1);
        Workload {
            table,
            family,
            columns: 4,
            keys: 10_000,
            key_distribution: KeyDistribution::Zipf { theta: 0.99 },
            value_size: ValueSize::Fixed(1024),
            read: 0.94,
            write: 0.05,
            delete: 0.01,
            increment: 0.0,
            batch: 0.0,
            batch_rows: 10,
            counter_family: String::new(),
            modes: ModeMix {
                eventual: 0.8,
                affinity: 0.1,
                watermark: 0.05,
                bounded: 0.05,
                as_of: 0.0,
            },
            bounded_ms: 2_000,
            as_of_ms: 2_000,
            read_back: 0.0,
            write_ack: WriteAck::Origin,
            deadline: SimDuration::from_ms(20),
            write_deadline: SimDuration::from_ms(200),
            hedge: true,
            record_reads: 0,
            app_profile: "frontend".into(),
            prefixes: BTreeMap::new(),
            global_prefix: "g/".into(),
            local_fraction: 0.0,
            regions: serving
                .into_iter()
                .map(|(region, n)| RegionLoad {
                    fill: false,
                    region,
                    clients: 2,
                    rate: rate * n as f64 / total as f64,
                })
                .collect(),
        }
    }
}

impl Scenario {
    /// An equal scenario that shares no `Arc` with this one, for a shard on a
    /// thread of its own: its deployments are detached (`detach::deployment`), and
    /// the regions of its workload and the replicas and regions of its faults are
    /// the detached deployment's.
    pub fn detached(&self) -> Scenario {
        let mut sc = self.clone();
        let d = Arc::new(crate::detach::deployment(&self.deployment));
        let region = |r: &mut RegionId| {
            if let Some((own, _)) = d.topology.regions.get_key_value(r.as_str()) {
                *r = own.clone();
            }
        };
        let replica = |r: &mut ReplicaId| {
            if let Some((own, _)) = d.topology.replicas.get_key_value(r.as_str()) {
                *r = own.clone();
            }
        };
        sc.workload
            .regions
            .iter_mut()
            .for_each(|l| region(&mut l.region));
        for f in &mut sc.faults {
            match &mut f.kind {
                FaultKind::Lose {
                    replicas, regions, ..
                } => {
                    replicas.iter_mut().for_each(replica);
                    regions.iter_mut().for_each(region);
                }
                FaultKind::Partition { a, b, .. } | FaultKind::DegradeLink { a, b, .. } => {
                    a.iter_mut().chain(b.iter_mut()).for_each(region);
                }
                FaultKind::ClockSkew { replicas, .. }
                | FaultKind::Pause { replicas }
                | FaultKind::Slow { replicas, .. } => {
                    replicas.iter_mut().for_each(replica);
                }
                FaultKind::ChangePlacement { deployment, .. } => {
                    *deployment = Arc::new(crate::detach::deployment(deployment));
                }
                FaultKind::Backup { region: r, .. } => region(r),
                FaultKind::Migrate { .. } => {}
            }
        }
        sc.deployment = d;
        sc
    }

    /// A scenario with the ad-serving workload, no faults and no SLOs beyond the
    /// invariants: the base that drill files and the swarm fill in.
    pub fn new(name: &str, deployment: Arc<Deployment>, seed: u64, duration: SimDuration) -> Self {
        let workload = Workload::ad_serving(&deployment, 500.0);
        Scenario {
            name: name.to_owned(),
            seed,
            topology_path: deployment.topology.name.clone(),
            placement_path: None,
            deployment,
            duration,
            warmup: SimDuration::ZERO,
            drain_max: SimDuration::from_secs(60),
            net: NetConfig::default(),
            replica: ReplicaConfig::default(),
            host: Hosts::default(),
            clock_skew_ms_max: 0,
            workload,
            faults: Vec::new(),
            slo: Slo::default(),
        }
    }
}
