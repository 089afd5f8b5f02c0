//! The validated topology: continents, regions, replicas, links and app profiles, plus
//! the replica-to-replica round-trip matrix derived from them.

use crate::ids::{RegionId, ReplicaId, ScopeId};
use crate::problems::{KeyPath, Problem, ProblemKind, Problems, Source};
use crate::raw::{RawAppProfile, RawTopology};
use crate::schema::validate_name;
use crate::shard::SHARD_GROUPS_MAX;
use petgraph::graph::UnGraph;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

/// What a replica does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Stores every row it may hold and serves frontends.
    Serving,
    /// Stores rows and serves batch app profiles only (analytics, model training).
    Batch,
    /// Forwards replication traffic along the tree and stores no rows: a bandwidth
    /// saver between continents.
    Relay,
}

impl Role {
    pub fn stores_rows(self) -> bool {
        self != Role::Relay
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replica {
    pub id: ReplicaId,
    pub region: RegionId,
    pub continent: String,
    pub zone: Option<String>,
    pub role: Role,
    pub address: Option<String>,
    /// Rendezvous weight for row affinity (> 0).
    pub weight: f64,
    /// `hub = true | false` in the file: prefer or avoid this replica as a
    /// replication hub ([`Replica::hub_rank`]); `None`: by its role.
    pub hub: Option<bool>,
    /// Processes the replica runs (≥ 1, ≤ the deployment's shard groups); process
    /// `p` hosts [`crate::shard::groups_of_process`].
    pub processes: u32,
    /// The replica this entry is a process of. A replica of one process is one
    /// entry, itself; a replica of P > 1 processes is P entries of
    /// [`Topology::replicas`], `<id>` (process 0) and `<id>.p1` … `<id>.p<P-1>`,
    /// each a member of replication in its own right for the groups it hosts
    /// (docs/sharding.md).
    pub of: ReplicaId,
    /// This entry's process index in its replica (0 ..= processes − 1, or up to
    /// the old count − 1 while a resize drains processes).
    pub index: u32,
    /// A resize of this replica in progress, if any (docs/sharding.md, "Resizing
    /// a replica").
    pub resize: Option<Resize>,
    /// The replica is being removed (`draining = true`, which `topology apply`
    /// writes before it removes a replica): it refuses writes, routes leave it
    /// out, and it stays a member of replication until its stream has reached
    /// every peer (docs/operations.md, "Add a region or a replica").
    pub draining: bool,
}

/// A replica moving from `from` processes to its `processes`: each shard group
/// whose host changes is held by both its old and its new process while the move
/// runs — one serving it (routes and the replication tree), the other a leaf
/// of the tree under it that follows its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Resize {
    /// The process count before the move.
    pub from: u32,
    pub phase: ResizePhase,
}

/// Where a resize is: which layout serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ResizePhase {
    /// The old layout serves; the new hosts copy their groups (snapshot, then the
    /// stream) from the old ones.
    Copy,
    /// The new layout serves; the old hosts follow, answer reads of clients that
    /// still route by the old layout, and refuse writes.
    Serve,
}

impl ResizePhase {
    pub fn name(self) -> &'static str {
        match self {
            ResizePhase::Copy => "copy",
            ResizePhase::Serve => "serve",
        }
    }
}

/// The id of process `index` of replica `replica`: the replica's own for 0.
pub fn process_id(replica: &str, index: u32) -> ReplicaId {
    if index == 0 {
        ReplicaId::new(replica)
    } else {
        ReplicaId::new(format!("{replica}.p{index}").as_str())
    }
}

/// The address process `index` listens on: the replica's `host:port` with the
/// port plus `index` (`None` when the port cannot take it).
fn process_address(address: &str, index: u32) -> Option<String> {
    let (host, port) = address.rsplit_once(':')?;
    let port = port
        .parse::<u16>()
        .ok()?
        .checked_add(u16::try_from(index).ok()?)?;
    Some(format!("{host}:{port}"))
}

impl Replica {
    /// The entries of processes 1 ..= `processes` − 1 of the replica whose
    /// process 0 this entry is: ids from [`process_id`], addresses the port plus
    /// the index (`None` where the replica's address has no port that can take
    /// it).
    pub fn process_entries(&self) -> Vec<Replica> {
        (1..self.process_count())
            .map(|index| Replica {
                id: process_id(self.id.as_str(), index),
                address: self
                    .address
                    .as_deref()
                    .and_then(|a| process_address(a, index)),
                index,
                ..self.clone()
            })
            .collect()
    }

    /// How many processes the replica runs now: its `processes`, or more while a
    /// resize drains some.
    pub fn process_count(&self) -> u32 {
        self.resize
            .map_or(self.processes, |r| r.from.max(self.processes))
    }

    /// The process count whose layout routes requests ([`crate::shard::process_of`]):
    /// the old one until a resize's serve phase.
    pub fn serving_processes(&self) -> u32 {
        match self.resize {
            Some(Resize {
                from,
                phase: ResizePhase::Copy,
            }) => from,
            _ => self.processes,
        }
    }

    /// How much spanning trees avoid routing through this replica, where edges
    /// are equally long (the lower, the likelier a hub): `hub = true` 0, relays 1
    /// (they exist to forward), serving replicas 2, batch replicas 3 (batch loads
    /// must not sit on every replication path of their region), `hub = false` 4.
    pub fn hub_rank(&self) -> u8 {
        match (self.hub, self.role) {
            (Some(true), _) => 0,
            (Some(false), _) => 4,
            (None, Role::Relay) => 1,
            (None, Role::Serving) => 2,
            (None, Role::Batch) => 3,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Region {
    pub name: RegionId,
    pub continent: String,
    /// Round trip between two replicas of this region.
    pub intra_rtt_ms: f64,
    /// In id order.
    pub replicas: Vec<ReplicaId>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Link {
    pub a: RegionId,
    pub b: RegionId,
    pub rtt_ms: f64,
    pub cost_per_gb: f64,
    pub bandwidth_mbps: Option<f64>,
    /// Packet loss probability, 0 ≤ loss < 1.
    pub loss: f64,
}

/// How traffic between two replicas is classed, for WAN accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkClass {
    IntraRegion,
    InterRegion,
    InterContinent,
}

impl LinkClass {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkClass::IntraRegion => "intra_region",
            LinkClass::InterRegion => "inter_region",
            LinkClass::InterContinent => "inter_continent",
        }
    }
}

/// How an app profile picks replicas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Routing {
    /// The nearest healthy replica by measured round trip.
    Nearest,
    /// Only these replicas (batch work on batch replicas).
    Pinned(Vec<ReplicaId>),
    /// Only replicas in the caller's own region.
    RegionLocal,
}

/// Where an app profile's writes go by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WriteRouting {
    /// The nearest healthy allowed replica (the lowest write latency).
    #[default]
    Nearest,
    /// The row's rendezvous replica in the caller's region — the one row-affinity
    /// reads go to, so they read the write back without a token — or the nearest
    /// when it is down.
    RowAffinity,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Priority {
    Serving,
    Batch,
}

/// What an app profile may do with a table it is granted (principle 8: a client is
/// bound to an app profile with table and read/write permissions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Reads: get, get-many, scan.
    Read,
    /// Reads and writes (mutations).
    ReadWrite,
}

impl Access {
    /// As written in the topology file: `"read"` or `"read-write"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::ReadWrite => "read-write",
        }
    }

    /// Whether this grant covers an operation that needs `needed`: `ReadWrite`
    /// covers both, `Read` only reads.
    pub fn allows(self, needed: Access) -> bool {
        // The variants are ordered by what they allow.
        self >= needed
    }

    fn parse(s: &str) -> Option<Access> {
        match s {
            "read" => Some(Access::Read),
            "read-write" => Some(Access::ReadWrite),
            _ => None,
        }
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A class of clients: how it picks replicas, and what it may touch. Permissions are
/// default deny: only the tables in `tables`, and only rows of the placement
/// policies in `policies` (every policy when `None`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AppProfile {
    pub name: String,
    pub routing: Routing,
    pub priority: Priority,
    /// Where the profile's writes go unless a call says otherwise
    /// (`writes = "row-affinity"` in the file; default nearest).
    pub writes: WriteRouting,
    /// Table → access. Keys are `Arc<str>` like the placement's table names (the
    /// simulator's deep copies give each copy its own); never a system table
    /// (`_*`), never empty in a validated topology.
    pub tables: BTreeMap<Arc<str>, Access>,
    /// The placement policies (scopes) whose rows the profile may touch; `None`:
    /// every policy. Never `Some` of an empty set in a validated topology.
    pub policies: Option<BTreeSet<ScopeId>>,
}

impl AppProfile {
    /// The access this profile grants on `table` (`None`: none).
    pub fn access(&self, table: &str) -> Option<Access> {
        self.tables.get(table).copied()
    }

    /// Whether rows of placement policy `scope` are open to this profile.
    pub fn may_touch_policy(&self, scope: &ScopeId) -> bool {
        // A grant names policies; a scope of one shard group answers for its policy.
        self.policies
            .as_ref()
            .is_none_or(|p| p.contains(scope.policy()))
    }

    /// Whether callers of this profile may use `replica`: its priority class matches
    /// the replica's role (serving or batch), and a pinned profile lists it.
    pub fn may_use(&self, replica: &Replica) -> bool {
        let class_ok = match self.priority {
            Priority::Serving => replica.role == Role::Serving,
            Priority::Batch => replica.role == Role::Batch,
        };
        let pinned_ok = match &self.routing {
            Routing::Pinned(list) => list.contains(&replica.of),
            _ => true,
        };
        class_ok && pinned_ok
    }
}

/// A validated topology. Every reference resolves, every region has a serving
/// replica, and links connect every replica.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub name: String,
    pub intra_region_rtt_ms: f64,
    /// Shard groups of the deployment (1 ..= [`crate::shard::SHARD_GROUPS_MAX`];
    /// docs/sharding.md).
    pub shard_groups: u32,
    /// Continent names in file order.
    pub continents: Vec<String>,
    pub regions: BTreeMap<RegionId, Region>,
    pub replicas: BTreeMap<ReplicaId, Replica>,
    /// Keyed by (a, b) with a < b.
    pub links: BTreeMap<(RegionId, RegionId), Link>,
    pub app_profiles: BTreeMap<String, AppProfile>,
    /// Shortest-path round trip between regions over links.
    pub(crate) region_rtt_ms: BTreeMap<(RegionId, RegionId), f64>,
}

fn finite_non_negative(v: f64) -> bool {
    v.is_finite() && v >= 0.0
}

impl Topology {
    pub(crate) fn from_raw(raw: RawTopology, src: &Source) -> Result<Topology, Problems> {
        let mut problems: Vec<Problem> = Vec::new();
        let root = KeyPath::root();
        let mut p = |kind, key: &KeyPath, msg: String| problems.push(src.problem(kind, key, msg));

        if !finite_non_negative(raw.intra_region_rtt_ms) {
            p(
                ProblemKind::InvalidValue,
                &root.key("intra_region_rtt_ms"),
                format!("latency must be ≥ 0 ms, got {}", raw.intra_region_rtt_ms),
            );
        }
        // `processes_max`: with a bad `shard_groups`, replicas are checked against
        // the largest it may be, so that one mistake is one problem.
        let (shard_groups, processes_max) = match raw.shard_groups {
            None => (1, 1),
            Some(g) if (1..=i64::from(SHARD_GROUPS_MAX)).contains(&g) => (g as u32, g as u32),
            Some(g) => {
                p(
                    ProblemKind::InvalidValue,
                    &root.key("shard_groups"),
                    format!("shard_groups must be 1 ..= {SHARD_GROUPS_MAX}, got {g}"),
                );
                (1, SHARD_GROUPS_MAX)
            }
        };
        // Every id the file declares: a process id (`<id>.p<n>`) may not be one.
        let declared: BTreeSet<&str> = raw
            .continents
            .iter()
            .flat_map(|c| &c.regions)
            .flat_map(|r| &r.replicas)
            .map(|r| r.id.as_str())
            .collect();
        let mut continents = Vec::new();
        let mut regions: BTreeMap<RegionId, Region> = BTreeMap::new();
        let mut replicas: BTreeMap<ReplicaId, Replica> = BTreeMap::new();
        for (ci, c) in raw.continents.iter().enumerate() {
            let ck = root.key("continents").index(ci);
            if let Err(e) = validate_name("continent", &c.name) {
                p(ProblemKind::InvalidName, &ck.key("name"), e.to_string());
            }
            if continents.contains(&c.name) {
                p(
                    ProblemKind::Duplicate,
                    &ck.key("name"),
                    format!("continent {:?} is defined twice", c.name),
                );
            }
            continents.push(c.name.clone());
            for (ri, r) in c.regions.iter().enumerate() {
                let rk = ck.key("regions").index(ri);
                if let Err(e) = validate_name("region", &r.name) {
                    p(ProblemKind::InvalidName, &rk.key("name"), e.to_string());
                }
                let region_id = RegionId::new(r.name.as_str());
                if regions.contains_key(&region_id) {
                    p(
                        ProblemKind::Duplicate,
                        &rk.key("name"),
                        format!("region {:?} is defined twice", r.name),
                    );
                    continue;
                }
                let intra = r.intra_rtt_ms.unwrap_or(raw.intra_region_rtt_ms);
                // An inherited default was already checked above.
                if r.intra_rtt_ms.is_some() && !finite_non_negative(intra) {
                    p(
                        ProblemKind::InvalidValue,
                        &rk.key("intra_rtt_ms"),
                        format!("latency must be ≥ 0 ms, got {intra}"),
                    );
                }
                let mut ids = Vec::new();
                for (pi, rep) in r.replicas.iter().enumerate() {
                    let pk = rk.key("replicas").index(pi);
                    if let Err(e) = validate_name("replica", &rep.id) {
                        p(ProblemKind::InvalidName, &pk.key("id"), e.to_string());
                    }
                    let role = match rep.role.as_str() {
                        "serving" => Role::Serving,
                        "batch" => Role::Batch,
                        "relay" => Role::Relay,
                        other => {
                            p(
                                ProblemKind::InvalidValue,
                                &pk.key("role"),
                                format!("role {other:?} is not one of serving, batch, relay"),
                            );
                            Role::Serving
                        }
                    };
                    let weight = rep.weight.unwrap_or(1.0);
                    if !(weight.is_finite() && weight > 0.0) {
                        p(
                            ProblemKind::InvalidValue,
                            &pk.key("weight"),
                            format!("weight must be > 0, got {weight}"),
                        );
                    }
                    let processes = match rep.processes {
                        None => 1,
                        Some(n) if n >= 1 && n <= i64::from(processes_max) => n as u32,
                        Some(n) => {
                            p(
                                ProblemKind::InvalidValue,
                                &pk.key("processes"),
                                format!(
                                    "processes must be 1 ..= shard_groups ({processes_max}): \
                                     each process hosts at least one group, got {n}"
                                ),
                            );
                            1
                        }
                    };
                    let resize = match (rep.resize_from, rep.resize_phase.as_deref()) {
                        (None, None) => None,
                        (Some(from), Some(phase)) => {
                            let phase = match phase {
                                "copy" => Some(ResizePhase::Copy),
                                "serve" => Some(ResizePhase::Serve),
                                other => {
                                    p(
                                        ProblemKind::InvalidValue,
                                        &pk.key("resize_phase"),
                                        format!("resize_phase {other:?} is not one of copy, serve"),
                                    );
                                    None
                                }
                            };
                            let from_ok = from >= 1
                                && from <= i64::from(processes_max)
                                && from != i64::from(processes);
                            if !from_ok {
                                p(
                                    ProblemKind::InvalidValue,
                                    &pk.key("resize_from"),
                                    format!(
                                        "resize_from must be 1 ..= shard_groups ({processes_max}) and differ from \
                                         processes ({processes}), got {from}"
                                    ),
                                );
                            }
                            phase.filter(|_| from_ok).map(|phase| Resize {
                                from: from as u32,
                                phase,
                            })
                        }
                        (from, _) => {
                            let (present, missing) = if from.is_some() {
                                ("resize_from", "resize_phase")
                            } else {
                                ("resize_phase", "resize_from")
                            };
                            p(
                                ProblemKind::InvalidValue,
                                &pk.key(present),
                                format!(
                                    "a resize in progress needs both resize_from and \
                                     resize_phase; {missing} is missing (pangea cluster \
                                     resize writes them)"
                                ),
                            );
                            None
                        }
                    };
                    let id = ReplicaId::new(rep.id.as_str());
                    if replicas.contains_key(&id) {
                        p(
                            ProblemKind::Duplicate,
                            &pk.key("id"),
                            format!("replica {:?} is defined twice", rep.id),
                        );
                        continue;
                    }
                    let entry = Replica {
                        id: id.clone(),
                        region: region_id.clone(),
                        continent: c.name.clone(),
                        zone: rep.zone.clone(),
                        role,
                        address: rep.address.clone(),
                        weight,
                        hub: rep.hub,
                        processes,
                        of: id.clone(),
                        index: 0,
                        resize,
                        draining: rep.draining,
                    };
                    // Processes 1.. of the replica: entries of their own.
                    let mut bad_port = false;
                    for process in entry.process_entries() {
                        if declared.contains(process.id.as_str()) {
                            p(
                                ProblemKind::Duplicate,
                                &pk.key("processes"),
                                format!(
                                    "process {} of replica {:?} is named {:?}, which \
                                     another replica of the file is called",
                                    process.index, rep.id, process.id
                                ),
                            );
                            continue;
                        }
                        if let (Some(a), None, false) = (&rep.address, &process.address, bad_port) {
                            bad_port = true;
                            p(
                                ProblemKind::InvalidValue,
                                &pk.key("address"),
                                format!(
                                    "address {a:?}: a replica of {processes} processes needs \
                                     `host:port`, process p listening on port + p (≤ 65535)"
                                ),
                            );
                        }
                        ids.push(process.id.clone());
                        replicas.insert(process.id.clone(), process);
                    }
                    ids.push(id.clone());
                    replicas.insert(id, entry);
                }
                if !r.replicas.is_empty()
                    && !ids.iter().any(|id| replicas[id].role == Role::Serving)
                {
                    p(
                        ProblemKind::NoServingReplica,
                        &rk.key("name"),
                        format!("region {:?} has no serving replica", r.name),
                    );
                } else if r.replicas.is_empty() {
                    p(
                        ProblemKind::NoServingReplica,
                        &rk.key("name"),
                        format!("region {:?} has no replicas", r.name),
                    );
                }
                ids.sort();
                regions.insert(
                    region_id.clone(),
                    Region {
                        name: region_id,
                        continent: c.name.clone(),
                        intra_rtt_ms: intra,
                        replicas: ids,
                    },
                );
            }
        }

        let mut links = BTreeMap::new();
        for (li, l) in raw.links.iter().enumerate() {
            let lk = root.key("links").index(li);
            let mut ok = true;
            for (field, name) in [("a", &l.a), ("b", &l.b)] {
                if !regions.contains_key(name.as_str()) {
                    p(
                        ProblemKind::UnknownReference,
                        &lk.key(field),
                        format!("unknown region {name:?}"),
                    );
                    ok = false;
                }
            }
            if l.a == l.b {
                p(
                    ProblemKind::SelfLink,
                    &lk.key("b"),
                    format!("link from region {:?} to itself", l.a),
                );
                ok = false;
            }
            match l.rtt_ms {
                None => p(
                    ProblemKind::MissingField,
                    &lk,
                    format!("link {} – {} has no `rtt_ms`", l.a, l.b),
                ),
                // Still a link for connectivity, so one bad number is one problem.
                Some(rtt) if !finite_non_negative(rtt) => {
                    p(
                        ProblemKind::InvalidValue,
                        &lk.key("rtt_ms"),
                        format!("latency must be ≥ 0 ms, got {rtt}"),
                    );
                }
                Some(_) => {}
            }
            if !finite_non_negative(l.cost_per_gb) {
                p(
                    ProblemKind::InvalidValue,
                    &lk.key("cost_per_gb"),
                    format!("cost must be ≥ 0, got {}", l.cost_per_gb),
                );
            }
            if let Some(bw) = l.bandwidth_mbps
                && !(bw.is_finite() && bw > 0.0)
            {
                p(
                    ProblemKind::InvalidValue,
                    &lk.key("bandwidth_mbps"),
                    format!("bandwidth must be > 0, got {bw}"),
                );
            }
            if !(l.loss.is_finite() && (0.0..1.0).contains(&l.loss)) {
                p(
                    ProblemKind::InvalidValue,
                    &lk.key("loss"),
                    format!("loss must be in [0, 1), got {}", l.loss),
                );
            }
            let (a, b) = if l.a <= l.b {
                (&l.a, &l.b)
            } else {
                (&l.b, &l.a)
            };
            let key = (RegionId::new(a.as_str()), RegionId::new(b.as_str()));
            if links.contains_key(&key) {
                p(
                    ProblemKind::Duplicate,
                    &lk,
                    format!("link {a} – {b} is defined twice"),
                );
                ok = false;
            }
            if ok {
                links.insert(
                    key.clone(),
                    Link {
                        a: key.0,
                        b: key.1,
                        rtt_ms: l.rtt_ms.unwrap_or(0.0),
                        cost_per_gb: l.cost_per_gb,
                        bandwidth_mbps: l.bandwidth_mbps,
                        loss: l.loss,
                    },
                );
            }
        }

        let mut app_profiles = BTreeMap::new();
        for (ai, a) in raw.app_profiles.iter().enumerate() {
            let ak = root.key("app_profiles").index(ai);
            if let Err(e) = validate_name("app profile", &a.name) {
                p(ProblemKind::InvalidName, &ak.key("name"), e.to_string());
            }
            let routing = match a.routing.as_str() {
                "nearest" => Routing::Nearest,
                "region-local" => Routing::RegionLocal,
                "pinned" => {
                    if a.replicas.is_empty() {
                        p(
                            ProblemKind::MissingField,
                            &ak.key("replicas"),
                            "a pinned profile needs `replicas`".into(),
                        );
                    }
                    for (i, r) in a.replicas.iter().enumerate() {
                        match replicas.get(r.as_str()) {
                            None => p(
                                ProblemKind::UnknownReference,
                                &ak.key("replicas").index(i),
                                format!("unknown replica {r:?}"),
                            ),
                            Some(rep) if rep.role == Role::Relay => p(
                                ProblemKind::PinnedRelay,
                                &ak.key("replicas").index(i),
                                format!(
                                    "replica {r:?} is a relay and stores no rows; pin serving or batch replicas"
                                ),
                            ),
                            Some(_) => {}
                        }
                    }
                    Routing::Pinned(
                        a.replicas
                            .iter()
                            .map(|r| ReplicaId::new(r.as_str()))
                            .collect(),
                    )
                }
                other => {
                    p(
                        ProblemKind::InvalidValue,
                        &ak.key("routing"),
                        format!("routing {other:?} is not one of nearest, pinned, region-local"),
                    );
                    Routing::Nearest
                }
            };
            if !matches!(routing, Routing::Pinned(_)) && !a.replicas.is_empty() {
                p(
                    ProblemKind::InvalidValue,
                    &ak.key("replicas"),
                    "`replicas` applies only to routing = \"pinned\"".into(),
                );
            }
            let priority = match a.priority.as_str() {
                "serving" => Priority::Serving,
                "batch" => Priority::Batch,
                other => {
                    p(
                        ProblemKind::InvalidValue,
                        &ak.key("priority"),
                        format!("priority {other:?} is not one of serving, batch"),
                    );
                    Priority::Serving
                }
            };
            let writes = match a.writes.as_deref() {
                None | Some("nearest") => WriteRouting::Nearest,
                Some("row-affinity") => WriteRouting::RowAffinity,
                Some(other) => {
                    p(
                        ProblemKind::InvalidValue,
                        &ak.key("writes"),
                        format!("writes {other:?} is not one of nearest, row-affinity"),
                    );
                    WriteRouting::Nearest
                }
            };
            let tables = profile_tables(a, &ak, &mut p);
            let policies = profile_policies(a, &ak, &mut p);
            if app_profiles
                .insert(
                    a.name.clone(),
                    AppProfile {
                        name: a.name.clone(),
                        routing,
                        priority,
                        writes,
                        tables,
                        policies,
                    },
                )
                .is_some()
            {
                p(
                    ProblemKind::Duplicate,
                    &ak.key("name"),
                    format!("app profile {:?} is defined twice", a.name),
                );
            }
        }

        // Connectivity: every region must reach every other over links.
        let components = region_components(&regions, &links);
        if components.len() > 1 {
            let names: Vec<String> = components
                .iter()
                .map(|c| {
                    format!(
                        "{{{}}}",
                        c.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(", ")
                    )
                })
                .collect();
            p(
                ProblemKind::Disconnected,
                &root.key("links"),
                format!(
                    "links do not connect every replica; separate groups of regions: {}",
                    names.join(" ")
                ),
            );
        }

        if !problems.is_empty() {
            problems.sort_by_key(|p| p.line.unwrap_or(0));
            return Err(Problems(problems));
        }
        let region_rtt_ms = shortest_paths(&regions, &links);
        Ok(Topology {
            name: raw.name,
            intra_region_rtt_ms: raw.intra_region_rtt_ms,
            shard_groups,
            continents,
            regions,
            replicas,
            links,
            app_profiles,
            region_rtt_ms,
        })
    }

    pub fn replica(&self, id: &str) -> Option<&Replica> {
        self.replicas.get(id)
    }

    /// Recomputes the round trips between regions from `regions` and `links`, for
    /// a caller that edited either in place (the fields are public; the round
    /// trips are derived from them at parse time).
    pub fn recompute_paths(&mut self) {
        self.region_rtt_ms = shortest_paths(&self.regions, &self.links);
    }

    /// This topology with every replica running `processes` processes (for a
    /// drill rehearsing a layout; docs/sharding.md). Refused, saying why,
    /// outside `1 ..= shard_groups` or where a process id would be another
    /// replica's.
    pub fn with_processes(mut self, processes: u32) -> Result<Topology, String> {
        if !(1..=self.shard_groups).contains(&processes) {
            return Err(format!(
                "processes must be 1 ..= shard_groups ({}): each process hosts at least one \
                 group, got {processes}",
                self.shard_groups
            ));
        }
        let firsts: Vec<Replica> = self
            .replicas
            .values()
            .filter(|r| r.index == 0)
            .map(|r| Replica {
                processes,
                resize: None,
                ..r.clone()
            })
            .collect();
        self.replicas = firsts.iter().map(|r| (r.id.clone(), r.clone())).collect();
        for r in &firsts {
            for process in r.process_entries() {
                if self.replicas.contains_key(&process.id) {
                    return Err(format!(
                        "process {} of replica {} would be named {}, another replica's id",
                        process.index, r.id, process.id
                    ));
                }
                self.replicas.insert(process.id.clone(), process);
            }
        }
        for region in self.regions.values_mut() {
            region.replicas = self
                .replicas
                .values()
                .filter(|r| r.region == region.name)
                .map(|r| r.id.clone())
                .collect();
        }
        Ok(self)
    }

    pub fn region_of(&self, id: &str) -> Option<&RegionId> {
        self.replicas.get(id).map(|r| &r.region)
    }

    /// Round trip between two regions along the cheapest path of links (0 for the
    /// same region: use [`Topology::rtt_ms`] for replicas).
    pub fn region_rtt_ms(&self, a: &RegionId, b: &RegionId) -> Option<f64> {
        if a == b {
            return Some(0.0);
        }
        let key = if a < b {
            (a.clone(), b.clone())
        } else {
            (b.clone(), a.clone())
        };
        self.region_rtt_ms.get(&key).copied()
    }

    /// Round trip between two replicas: the region's intra-region round trip inside
    /// one region, else the cheapest path of links between their regions.
    pub fn rtt_ms(&self, a: &ReplicaId, b: &ReplicaId) -> Option<f64> {
        if a == b {
            return Some(0.0);
        }
        let (ra, rb) = (self.replicas.get(a)?, self.replicas.get(b)?);
        if ra.region == rb.region {
            return Some(self.regions[&ra.region].intra_rtt_ms);
        }
        self.region_rtt_ms(&ra.region, &rb.region)
    }

    /// The direct link between two regions, if the file has one.
    pub fn link(&self, a: &RegionId, b: &RegionId) -> Option<&Link> {
        let key = if a < b {
            (a.clone(), b.clone())
        } else {
            (b.clone(), a.clone())
        };
        self.links.get(&key)
    }

    pub fn link_class(&self, a: &ReplicaId, b: &ReplicaId) -> Option<LinkClass> {
        let (ra, rb) = (self.replicas.get(a)?, self.replicas.get(b)?);
        Some(if ra.region == rb.region {
            LinkClass::IntraRegion
        } else if ra.continent == rb.continent {
            LinkClass::InterRegion
        } else {
            LinkClass::InterContinent
        })
    }

    /// Replicas of the given regions, in id order.
    pub fn replicas_in<'a>(
        &'a self,
        regions: &'a BTreeSet<RegionId>,
    ) -> impl Iterator<Item = &'a Replica> + 'a {
        self.replicas
            .values()
            .filter(|r| regions.contains(&r.region))
    }

    pub fn all_regions(&self) -> BTreeSet<RegionId> {
        self.regions.keys().cloned().collect()
    }
}

/// The grants of an app profile (`tables`), as far as the topology alone can check
/// them: names and access values. Whether the tables exist is the placement's to
/// say ([`crate::Deployment::load`]).
fn profile_tables(
    a: &RawAppProfile,
    ak: &KeyPath,
    p: &mut impl FnMut(ProblemKind, &KeyPath, String),
) -> BTreeMap<Arc<str>, Access> {
    let hint = format!(
        "app profile {:?} grants no table: add tables = {{ <table> = \"read\" }}",
        a.name
    );
    let Some(raw) = &a.tables else {
        p(ProblemKind::MissingField, ak, hint);
        return BTreeMap::new();
    };
    if raw.is_empty() {
        p(ProblemKind::InvalidValue, &ak.key("tables"), hint);
    }
    let mut tables = BTreeMap::new();
    for (table, access) in raw {
        let tk = ak.key("tables").key(table);
        let mut ok = true;
        if let Err(e) = validate_name("table", table) {
            p(ProblemKind::InvalidName, &tk, e.to_string());
            ok = false;
        } else if table.starts_with('_') {
            p(
                ProblemKind::InvalidName,
                &tk,
                format!(
                    "{table:?}: system tables cannot be granted to app profiles; they are reached through operator commands"
                ),
            );
            ok = false;
        }
        let Some(access) = Access::parse(access) else {
            p(
                ProblemKind::InvalidValue,
                &tk,
                format!("access {access:?} is not one of read, read-write"),
            );
            continue;
        };
        if ok {
            tables.insert(Arc::from(table.as_str()), access);
        }
    }
    tables
}

/// The policies an app profile is restricted to, checked as names (their existence
/// is the placement's to say).
fn profile_policies(
    a: &RawAppProfile,
    ak: &KeyPath,
    p: &mut impl FnMut(ProblemKind, &KeyPath, String),
) -> Option<BTreeSet<ScopeId>> {
    let raw = a.policies.as_ref()?;
    if raw.is_empty() {
        p(
            ProblemKind::ProfileReachesNothing,
            &ak.key("policies"),
            format!(
                "app profile {:?} lists no policy, so no row is open to it: name policies, or remove `policies` to open every policy",
                a.name
            ),
        );
    }
    let mut policies = BTreeSet::new();
    for (i, name) in raw.iter().enumerate() {
        let pk = ak.key("policies").index(i);
        if let Err(e) = validate_name("policy", name) {
            p(ProblemKind::InvalidName, &pk, e.to_string());
        } else if !policies.insert(ScopeId::new(name.as_str())) {
            p(
                ProblemKind::Duplicate,
                &pk,
                format!("policy {name:?} listed twice"),
            );
        }
    }
    Some(policies)
}

/// Connected groups of regions over links (a region with replicas but no link is its
/// own group). Deterministic order.
pub(crate) fn region_components(
    regions: &BTreeMap<RegionId, Region>,
    links: &BTreeMap<(RegionId, RegionId), Link>,
) -> Vec<BTreeSet<RegionId>> {
    let names: Vec<&RegionId> = regions.keys().collect();
    let index: BTreeMap<&RegionId, usize> =
        names.iter().enumerate().map(|(i, r)| (*r, i)).collect();
    let mut sets = petgraph::unionfind::UnionFind::<usize>::new(names.len());
    for (a, b) in links.keys() {
        if let (Some(&ia), Some(&ib)) = (index.get(a), index.get(b)) {
            sets.union(ia, ib);
        }
    }
    let mut groups: BTreeMap<usize, BTreeSet<RegionId>> = BTreeMap::new();
    for (i, name) in names.iter().enumerate() {
        groups
            .entry(sets.find(i))
            .or_default()
            .insert((*name).clone());
    }
    let mut out: Vec<_> = groups.into_values().collect();
    out.sort();
    out
}

fn shortest_paths(
    regions: &BTreeMap<RegionId, Region>,
    links: &BTreeMap<(RegionId, RegionId), Link>,
) -> BTreeMap<(RegionId, RegionId), f64> {
    let names: Vec<&RegionId> = regions.keys().collect();
    let index: BTreeMap<&RegionId, usize> =
        names.iter().enumerate().map(|(i, r)| (*r, i)).collect();
    let mut g = UnGraph::<(), f64>::new_undirected();
    let nodes: Vec<_> = names.iter().map(|_| g.add_node(())).collect();
    for ((a, b), l) in links {
        g.add_edge(nodes[index[a]], nodes[index[b]], l.rtt_ms);
    }
    let mut out = BTreeMap::new();
    for (i, a) in names.iter().enumerate() {
        let dist = petgraph::algo::dijkstra(&g, nodes[i], None, |e| *e.weight());
        for (j, b) in names.iter().enumerate() {
            if i < j
                && let Some(d) = dist.get(&nodes[j])
            {
                out.insert(((*a).clone(), (*b).clone()), *d);
            }
        }
    }
    out
}
