//! The deployment as data.
//!
//! Operators describe a Pangea deployment in two TOML files they edit by hand: a
//! *topology* (continents → regions → replicas, links between regions, app profiles)
//! and a *placement* (tables with their families and GC policies, placement policies,
//! prefix rules and home-region rules). Every replica, the client library and the
//! simulator read them through this crate.
//!
//! Loading follows "parse, don't validate": figment layers the file and `PANGEA_*`
//! environment overrides into the raw structs of [`raw`] (`deny_unknown_fields`), then
//! the validated [`Topology`] and [`Placement`] are built from them, reporting every
//! problem at once with file, line and key ([`Problems`]).
//!
//! Modules:
//! - this file: [`Deployment`] (a topology and a placement validated against each
//!   other), loading with `PANGEA_*` overrides, and [`files_digest`];
//! - [`ids`]: replica, region and scope identifiers;
//! - [`schema`]: tables, families and GC policies;
//! - [`raw`]: the files as written;
//! - [`problems`]: problems with file, line and key;
//! - [`topology`]: the validated topology: continents, regions, replicas, links, app
//!   profiles and their grants, the replica round-trip matrix;
//! - [`placement`]: the validated placement: the schema, placement policies, prefix
//!   and home-region rules;
//! - `grants`: app profile grants checked against the placement;
//! - [`generate`]: random deployments for the seeded harnesses (the core's cluster
//!   harness, the simulator's swarm);
//! - [`tree`]: minimum spanning trees per scope, over any subset of live replicas;
//! - [`affinity`]: weighted rendezvous hashing for row affinity;
//! - [`shard`]: shard groups: partition keys, key → group, group → process;
//! - [`plan`]: what `pangea topology plan` and `diff` report;
//! - [`svg`]: a drawing of the topology and its trees;
//! - [`cluster`]: the cluster file (`cluster.toml`): where a running deployment's
//!   replicas listen;

pub mod affinity;
pub mod cluster;
pub mod generate;
mod grants;
pub mod ids;
pub mod placement;
pub mod plan;
pub mod problems;
pub mod raw;
pub mod schema;
pub mod shard;
pub mod svg;
pub mod topology;
pub mod tree;

pub use ids::{RegionId, ReplicaId, ScopeId};
pub use placement::{GLOBAL_POLICY, Placement, Policy};
pub use problems::{Problem, ProblemKind, Problems};
pub use topology::{
    Access, AppProfile, LinkClass, Priority, Region, Replica, Resize, ResizePhase, Role, Routing,
    Topology, WriteRouting, process_id,
};
pub use tree::{Edge, Tree};

use figment::Figment;
use figment::providers::{Env, Format, Toml};
use problems::Source;
use std::collections::BTreeSet;
use std::path::Path;

/// Environment variables overriding topology fields: `PANGEA_TOPOLOGY_<FIELD>`,
/// nested fields joined by `__`.
pub const TOPOLOGY_ENV_PREFIX: &str = "PANGEA_TOPOLOGY_";
/// Environment variables overriding placement fields.
pub const PLACEMENT_ENV_PREFIX: &str = "PANGEA_PLACEMENT_";

/// A topology and a placement, validated against each other.
#[derive(Debug, Clone, PartialEq)]
pub struct Deployment {
    pub topology: Topology,
    pub placement: Placement,
}

/// What identifies a deployment's files: xxh3-64 of the topology text, a 0 byte
/// and the placement text (none: empty), never 0 (0 means "unknown"). Replicas
/// announce it in every response; a client holding other files fetches theirs.
pub fn files_digest(topology: &str, placement: Option<&str>) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(topology.as_bytes());
    h.update(&[0]);
    h.update(placement.unwrap_or("").as_bytes());
    h.digest().max(1)
}

/// Largest topology or placement file read: a deployment of thousands of replicas
/// fits in a fraction of it, and parsing stays well under a second.
pub const FILE_BYTES_MAX: u64 = 1 << 20;

fn read(path: &Path) -> Result<String, Problems> {
    if let Ok(m) = std::fs::metadata(path)
        && m.len() > FILE_BYTES_MAX
    {
        return Err(too_large(path, m.len()));
    }
    std::fs::read_to_string(path).map_err(|e| {
        Problems(vec![Problem {
            kind: ProblemKind::Read,
            file: path.to_owned(),
            line: None,
            key: String::new(),
            message: format!("cannot read: {e}"),
        }])
    })
}

fn too_large(path: &Path, size: u64) -> Problems {
    Problems(vec![Problem {
        kind: ProblemKind::Read,
        file: path.to_owned(),
        line: None,
        key: String::new(),
        message: format!("file is {size} bytes, limit {FILE_BYTES_MAX}"),
    }])
}

fn parse<T: serde::de::DeserializeOwned>(
    src: &Source,
    text: &str,
    env_prefix: Option<&str>,
) -> Result<T, Problems> {
    if text.len() as u64 > FILE_BYTES_MAX {
        return Err(too_large(src.file(), text.len() as u64));
    }
    if let Err(e) = toml_edit::ImDocument::parse(text) {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        let message = e.message().to_owned();
        return Err(Problems(vec![Problem {
            kind: ProblemKind::Syntax,
            file: src.file().to_owned(),
            line,
            key: String::new(),
            message: format!("invalid TOML: {message}"),
        }]));
    }
    let mut figment = Figment::from(Toml::string(text));
    if let Some(prefix) = env_prefix {
        figment = figment.merge(Env::prefixed(prefix).split("__"));
    }
    figment
        .extract::<T>()
        .map_err(|e| Problems(src.figment_problems(e, env_prefix.unwrap_or(""))))
}

impl Topology {
    /// Loads and validates a topology file, with `PANGEA_TOPOLOGY_*` overrides.
    pub fn load(path: &Path) -> Result<Topology, Problems> {
        let text = read(path)?;
        Self::parse_with(path, &text, Some(TOPOLOGY_ENV_PREFIX))
    }

    /// Parses topology text (no environment overrides); `path` names it in problems.
    pub fn parse(path: &Path, text: &str) -> Result<Topology, Problems> {
        Self::parse_with(path, text, None)
    }

    fn parse_with(path: &Path, text: &str, env: Option<&str>) -> Result<Topology, Problems> {
        let src = Source::new(path, text);
        let raw = parse(&src, text, env)?;
        Topology::from_raw(raw, &src)
    }
}

impl Placement {
    /// Loads and validates a placement file against `topology`, with
    /// `PANGEA_PLACEMENT_*` overrides.
    pub fn load(path: &Path, topology: &Topology) -> Result<Placement, Problems> {
        let text = read(path)?;
        Self::parse_with(path, &text, topology, Some(PLACEMENT_ENV_PREFIX))
    }

    pub fn parse(path: &Path, text: &str, topology: &Topology) -> Result<Placement, Problems> {
        Self::parse_with(path, text, topology, None)
    }

    fn parse_with(
        path: &Path,
        text: &str,
        topology: &Topology,
        env: Option<&str>,
    ) -> Result<Placement, Problems> {
        let src = Source::new(path, text);
        let raw = parse(&src, text, env)?;
        Placement::from_raw(raw, topology, &src)
    }
}

/// A validated topology with what checking it against a placement needs: its
/// profiles as written (file order, for key paths) and its text (for lines).
struct CheckedTopology {
    topology: Topology,
    profiles: Vec<raw::RawAppProfile>,
    src: Source,
}

impl CheckedTopology {
    fn parse(path: &Path, text: &str, env: Option<&str>) -> Result<CheckedTopology, Problems> {
        let src = Source::new(path, text);
        let raw: raw::RawTopology = parse(&src, text, env)?;
        let profiles = raw.app_profiles.clone();
        let topology = Topology::from_raw(raw, &src)?;
        Ok(CheckedTopology {
            topology,
            profiles,
            src,
        })
    }

    /// The deployment, once the topology's references into `placement` resolve.
    fn with(self, placement: Option<Placement>) -> Result<Deployment, Problems> {
        let Some(placement) = placement else {
            return Ok(Deployment {
                placement: Placement::global_only(&self.topology),
                topology: self.topology,
            });
        };
        let mut problems = grants::check(&self.profiles, &self.topology, &placement, &self.src);
        if !problems.is_empty() {
            problems.sort_by_key(|p| p.line.unwrap_or(0));
            return Err(Problems(problems));
        }
        Ok(Deployment {
            topology: self.topology,
            placement,
        })
    }
}

impl Deployment {
    /// Loads both files, with `PANGEA_TOPOLOGY_*` and `PANGEA_PLACEMENT_*` overrides;
    /// without a placement file, only the global policy exists.
    ///
    /// The topology is validated first, then the placement against it, then the
    /// topology's references into the placement (app profile grants: their tables and
    /// policies exist, a pinned profile can reach rows of its policies), reported at
    /// the topology file's lines. Without a placement file there is nothing to check
    /// grants against (the topology is being checked alone), so that last step is
    /// skipped: a deployment without placement has no user tables, and serves none.
    pub fn load(topology: &Path, placement: Option<&Path>) -> Result<Deployment, Problems> {
        let text = read(topology)?;
        let checked = CheckedTopology::parse(topology, &text, Some(TOPOLOGY_ENV_PREFIX))?;
        let placement = match placement {
            Some(p) => Some(Placement::load(p, &checked.topology)?),
            None => None,
        };
        checked.with(placement)
    }

    /// [`Deployment::load`] from texts, without environment overrides; the paths name
    /// the files in problems.
    pub fn parse(
        topology_path: &Path,
        topology_text: &str,
        placement: Option<(&Path, &str)>,
    ) -> Result<Deployment, Problems> {
        let checked = CheckedTopology::parse(topology_path, topology_text, None)?;
        let placement = match placement {
            Some((path, text)) => Some(Placement::parse(path, text, &checked.topology)?),
            None => None,
        };
        checked.with(placement)
    }

    /// Every placement policy: `global` first, then the others by name.
    pub fn policies(&self) -> impl Iterator<Item = &ScopeId> {
        let global = self
            .placement
            .policies
            .keys()
            .filter(|s| s.as_str() == GLOBAL_POLICY);
        global.chain(
            self.placement
                .policies
                .keys()
                .filter(|s| s.as_str() != GLOBAL_POLICY),
        )
    }

    /// Every replication scope, in [`Deployment::policies`] order and by group
    /// within a policy: the policies themselves in a deployment of one shard
    /// group, else one scope per (policy, group) (docs/sharding.md).
    pub fn scopes(&self) -> impl Iterator<Item = &ScopeId> {
        self.policies()
            .flat_map(|p| self.placement.policies[p].scopes().iter())
    }

    /// Replicas that may carry a scope's rows: those in the policy's regions (relays
    /// included: they forward but store nothing) — of a replica of many processes,
    /// the processes hosting the scope's group ([`Deployment::hosts`]).
    pub fn scope_members(&self, scope: &ScopeId) -> BTreeSet<ReplicaId> {
        match self.placement.policy(scope) {
            Some(p) => self
                .topology
                .replicas_in(&p.regions)
                .filter(|r| self.hosts(r, scope))
                .map(|r| r.id.clone())
                .collect(),
            None => BTreeSet::new(),
        }
    }

    /// Whether `replica` may hold or forward rows of `scope` (residency, principle 5):
    /// it is in the scope's policy's regions and hosts the scope's group.
    pub fn allowed(&self, replica: &ReplicaId, scope: &ScopeId) -> bool {
        match (
            self.topology.replica(replica.as_str()),
            self.placement.policy(scope),
        ) {
            (Some(r), Some(p)) => p.regions.contains(&r.region) && self.hosts(r, scope),
            _ => false,
        }
    }

    /// Whether process `r` hosts `scope`'s shard group: always for a replica of
    /// one process, and for the system scope, which every process holds (location
    /// metadata and jobs are read by every process); otherwise when the group is
    /// in the process's range ([`shard::process_of`]) — while the replica is
    /// resized, in its range under the old process count or the new one
    /// ([`Deployment::serves`] says which of the two serves). A policy named as a
    /// whole (no group: its tree in `topology plan`) is hosted by each replica's
    /// process 0, so that it has one member per replica.
    pub fn hosts(&self, r: &Replica, scope: &ScopeId) -> bool {
        self.hosts_under(r, scope, r.processes)
            || r.resize.is_some_and(|z| self.hosts_under(r, scope, z.from))
    }

    /// Whether process `r` serves `scope`: requests for its rows are routed to it
    /// and it is its replica's node in the scope's tree. The process hosting the
    /// group, except while a resize moves it: then the host under
    /// [`Replica::serving_processes`], the other one following as a leaf under it.
    pub fn serves(&self, r: &Replica, scope: &ScopeId) -> bool {
        self.hosts_under(r, scope, r.serving_processes())
    }

    /// [`Deployment::hosts`] were the replica of `r` to run `processes` processes.
    fn hosts_under(&self, r: &Replica, scope: &ScopeId, processes: u32) -> bool {
        if r.process_count() <= 1 {
            return true;
        }
        match scope.group() {
            None => r.index == 0,
            // Every process, of those the count has (a resize's added processes
            // follow the system scope until they serve; drained ones until they go).
            Some(g) if g.0 == 0 && scope.policy() == GLOBAL_POLICY => r.index < processes,
            Some(g) => shard::process_of(self.topology.shard_groups, processes, g) == r.index,
        }
    }

    /// Whether process `id` answers a client's read (or, if `write`, write) of a
    /// row of `scope`: it must be allowed it, not be draining (for a write), and
    /// serve it — except that during a
    /// resize's serve phase the old host, which follows the group, still answers
    /// reads (for clients that route by the old layout) while it refuses writes,
    /// so that its own stream of the group ends before the move finishes.
    pub fn answers(&self, id: &ReplicaId, scope: &ScopeId, write: bool) -> bool {
        let Some(r) = self.topology.replica(id.as_str()) else {
            return false;
        };
        self.allowed(id, scope)
            && !(write && r.draining)
            && (self.serves(r, scope)
                || (!write && r.resize.is_some_and(|z| z.phase == ResizePhase::Serve)))
    }

    /// Replicas a tool in `region` reads all of `scope` from (a backup, a
    /// restore's log): those that store and serve its rows and that app profile
    /// `profile` may use (any, when the topology has no such profile), the
    /// region's own first, then by round trip from it.
    pub fn scope_sources(
        &self,
        scope: &ScopeId,
        region: &RegionId,
        profile: &str,
    ) -> Vec<ReplicaId> {
        let profile = self.topology.app_profiles.get(profile);
        let mut rs: Vec<(u64, ReplicaId)> =
            self.scope_members(scope)
                .into_iter()
                .filter(|id| {
                    self.topology.replica(id.as_str()).is_some_and(|r| {
                        r.role.stores_rows() && profile.is_none_or(|p| p.may_use(r))
                    }) && self.answers(id, scope, false)
                })
                .map(|id| {
                    let rtt = match self.topology.region_of(id.as_str()) {
                        Some(r) if r == region => 0.0,
                        Some(r) => self.topology.region_rtt_ms(region, r).unwrap_or(1e6),
                        None => 1e6,
                    };
                    ((rtt * 1000.0) as u64, id)
                })
                .collect();
        rs.sort();
        rs.into_iter().map(|(_, id)| id).collect()
    }

    /// The process of `r`'s replica that serves `scope` when `r` only follows it
    /// (a resize moves its group), else `None`.
    pub fn leader_of(&self, r: &Replica, scope: &ScopeId) -> Option<&Replica> {
        if self.serves(r, scope) || !self.hosts(r, scope) {
            return None;
        }
        let g = scope.group()?;
        let index = shard::process_of(self.topology.shard_groups, r.serving_processes(), g);
        self.topology
            .replica(process_id(r.of.as_str(), index).as_str())
    }

    /// The scope's tree over the replicas in `live` (all members when `None`): the
    /// minimum spanning tree of the members that serve it, each resize's
    /// follower a leaf under the process it follows (or in the spanning tree,
    /// should that process not be live).
    pub fn tree(&self, scope: &ScopeId, live: Option<&BTreeSet<ReplicaId>>) -> Tree {
        let mut members = self.scope_members(scope);
        if let Some(live) = live {
            members.retain(|m| live.contains(m));
        }
        let mut leaves = Vec::new();
        for m in &members {
            let r = &self.topology.replicas[m];
            if let Some(leader) = self.leader_of(r, scope)
                && members.contains(&leader.id)
            {
                leaves.push((m.clone(), leader));
            }
        }
        for (leaf, _) in &leaves {
            members.remove(leaf);
        }
        let mut tree = self.topology.spanning_tree(scope.clone(), &members);
        for (leaf, leader) in leaves {
            let rtt = self.topology.regions[&leader.region].intra_rtt_ms;
            tree.attach_leaf(&leaf, &leader.id, rtt);
        }
        tree
    }

    /// The replication scope of a row as the files place it: its placement
    /// policy's, for the shard group of its partition key (system tables: group 0).
    pub fn scope_of(&self, table: &str, key: &[u8]) -> &ScopeId {
        let policy = self.placement.policy_of(table, key);
        self.group_scope(policy, table, key)
    }

    /// The replication scope of a row of `policy` (one of this deployment's
    /// policies): the policy's scope for the row's shard group.
    pub fn group_scope<'a>(&'a self, policy: &'a ScopeId, table: &str, key: &[u8]) -> &'a ScopeId {
        let groups = self.topology.shard_groups;
        if groups <= 1 {
            return policy;
        }
        let Some(p) = self.placement.policies.get(policy.policy()) else {
            return policy;
        };
        p.scope(self.group_of(table, key))
    }

    /// The shard group of a row: its table's partition key hashed
    /// ([`shard::group_of`]); system tables (`_location`, `_jobs`) are all in
    /// group 0, so location metadata and jobs stay in one stream.
    pub fn group_of(&self, table: &str, key: &[u8]) -> shard::GroupId {
        let groups = self.topology.shard_groups;
        if groups <= 1 || table.starts_with('_') {
            return shard::GroupId(0);
        }
        let spec = self
            .placement
            .schema
            .table(table)
            .and_then(|t| t.partition_key.as_ref());
        shard::group_of(groups, shard::partition_key(spec, key))
    }

    /// The one shard group every row of `table` starting with `prefix` is in, or
    /// `None` when they may be in any: a prefix names one group when it holds the
    /// whole partition key (the table declares one and the prefix reaches its
    /// last separator), or when there is one group at all.
    pub fn prefix_group(&self, table: &str, prefix: &[u8]) -> Option<shard::GroupId> {
        if self.topology.shard_groups <= 1 || table.starts_with('_') {
            return Some(shard::GroupId(0));
        }
        let spec = self.placement.schema.table(table)?.partition_key.as_ref()?;
        let whole = spec.of(prefix).len() < prefix.len();
        whole.then(|| self.group_of(table, prefix))
    }

    /// The scope system tables replicate in: group 0 of `global`.
    pub fn system_scope(&self) -> &ScopeId {
        self.placement.policies[GLOBAL_POLICY].scope(shard::GroupId(0))
    }

    /// The row-affinity replica of `key` among `region`'s serving replicas.
    pub fn affinity_replica(&self, region: &RegionId, key: &[u8]) -> Option<&ReplicaId> {
        let region = self.topology.regions.get(region)?;
        let candidates: Vec<(&ReplicaId, f64)> = region
            .replicas
            .iter()
            .filter_map(|id| self.topology.replicas.get(id))
            .filter(|r| r.role == Role::Serving)
            .map(|r| (&r.id, r.weight))
            .collect();
        affinity::rendezvous(&candidates, key)
    }
}
