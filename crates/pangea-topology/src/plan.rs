//! What `pangea topology plan` and `pangea topology diff` report, as serializable
//! data: the CLI prints it as tables or JSON, and anyone can recompute the trees from
//! `graph.links`.

use crate::Deployment;
use crate::ids::{RegionId, ReplicaId, ScopeId};
use crate::topology::{AppProfile, LinkClass};
use crate::tree::{Edge, Tree};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Bytes crossing each class of link for one 1 KiB mutation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct WanBytes {
    pub intra_region: f64,
    pub inter_region: f64,
    pub inter_continent: f64,
}

impl WanBytes {
    fn add(&mut self, class: LinkClass, bytes: f64) {
        match class {
            LinkClass::IntraRegion => self.intra_region += bytes,
            LinkClass::InterRegion => self.inter_region += bytes,
            LinkClass::InterContinent => self.inter_continent += bytes,
        }
    }

    pub fn total(&self) -> f64 {
        self.intra_region + self.inter_region + self.inter_continent
    }
}

/// Predicted one-way replication delay from an origin to one replica.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Delay {
    pub replica: ReplicaId,
    /// Half the round trips summed along the tree path.
    pub tree_ms: f64,
    /// Half the round trip of the cheapest direct path.
    pub direct_ms: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OriginDelays {
    pub origin: ReplicaId,
    pub max_tree_ms: f64,
    pub max_direct_ms: f64,
    pub to: Vec<Delay>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScopePlan {
    pub name: ScopeId,
    pub regions: BTreeSet<RegionId>,
    pub replicas: Vec<ReplicaId>,
    pub edges: Vec<Edge>,
    pub total_latency_ms: f64,
    /// Per origin (replicas that store rows), delays to every other member.
    pub delays: Vec<OriginDelays>,
    /// WAN bytes per 1 KiB mutation when it travels the tree (each edge once)…
    pub wan_bytes_tree: WanBytes,
    /// …and when its origin sends it straight to every replica (a full mesh),
    /// averaged over origins.
    pub wan_bytes_mesh: WanBytes,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Graph {
    /// Every candidate edge between replicas.
    pub links: Vec<Edge>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub topology: String,
    pub scopes: Vec<ScopePlan>,
    pub graph: Graph,
    /// The deployment's shard groups, and which process of each replica hosts
    /// which (docs/sharding.md).
    pub shard_groups: u32,
    pub shards: Vec<crate::shard::ReplicaShards>,
}

const MUTATION_BYTES: f64 = 1024.0;

impl Deployment {
    /// The plan of every scope.
    pub fn plan(&self) -> Plan {
        let t = &self.topology;
        let scopes = self
            .policies()
            .map(|scope| {
                let tree = self.tree(scope, None);
                self.scope_plan(scope, &tree)
            })
            .collect();
        let all: BTreeSet<ReplicaId> = t.replicas.keys().cloned().collect();
        Plan {
            topology: t.name.clone(),
            scopes,
            graph: Graph {
                links: t.candidate_edges(&all),
            },
            shard_groups: t.shard_groups,
            shards: self.shards(),
        }
    }

    fn scope_plan(&self, scope: &ScopeId, tree: &Tree) -> ScopePlan {
        let t = &self.topology;
        let members: Vec<ReplicaId> = tree.replicas.iter().cloned().collect();
        let storing: Vec<&ReplicaId> = members
            .iter()
            .filter(|r| t.replicas[*r].role.stores_rows())
            .collect();
        let mut wan_tree = WanBytes::default();
        for e in &tree.edges {
            if let Some(class) = t.link_class(&e.a, &e.b) {
                wan_tree.add(class, MUTATION_BYTES);
            }
        }
        let mut wan_mesh = WanBytes::default();
        let mut delays = Vec::new();
        for origin in &storing {
            for to in storing.iter().filter(|r| *r != origin) {
                if let Some(class) = t.link_class(origin, to) {
                    wan_mesh.add(class, MUTATION_BYTES / storing.len() as f64);
                }
            }
            let mut to = Vec::new();
            for r in members.iter().filter(|r| *r != *origin) {
                let tree_ms = tree.path(origin, r).map(|path| {
                    path.windows(2)
                        .map(|w| t.rtt_ms(&w[0], &w[1]).unwrap_or(f64::INFINITY) / 2.0)
                        .sum::<f64>()
                });
                let direct_ms = t.rtt_ms(origin, r).map(|d| d / 2.0);
                to.push(Delay {
                    replica: r.clone(),
                    tree_ms: tree_ms.unwrap_or(f64::INFINITY),
                    direct_ms: direct_ms.unwrap_or(f64::INFINITY),
                });
            }
            delays.push(OriginDelays {
                origin: (*origin).clone(),
                max_tree_ms: to.iter().map(|d| d.tree_ms).fold(0.0, f64::max),
                max_direct_ms: to.iter().map(|d| d.direct_ms).fold(0.0, f64::max),
                to,
            });
        }
        ScopePlan {
            name: scope.clone(),
            regions: self
                .placement
                .policy(scope)
                .map(|p| p.regions.clone())
                .unwrap_or_default(),
            replicas: members,
            total_latency_ms: tree.total_latency_ms(),
            edges: tree.edges.clone(),
            delays,
            wan_bytes_tree: wan_tree,
            wan_bytes_mesh: wan_mesh,
        }
    }

    /// What changes from `self` to `new`.
    pub fn diff(&self, new: &Deployment) -> Diff {
        let old_reps: BTreeSet<_> = self.topology.replicas.keys().cloned().collect();
        let new_reps: BTreeSet<_> = new.topology.replicas.keys().cloned().collect();
        let key = |e: &Edge| (e.a.clone(), e.b.clone());
        let scopes: BTreeSet<ScopeId> = self.policies().chain(new.policies()).cloned().collect();
        let mut tree_changes = Vec::new();
        for scope in &scopes {
            let before: BTreeMap<_, _> = self
                .tree(scope, None)
                .edges
                .into_iter()
                .map(|e| (key(&e), e))
                .collect();
            let after: BTreeMap<_, _> = new
                .tree(scope, None)
                .edges
                .into_iter()
                .map(|e| (key(&e), e))
                .collect();
            let added: Vec<Edge> = after
                .iter()
                .filter(|(k, _)| !before.contains_key(*k))
                .map(|(_, e)| e.clone())
                .collect();
            let removed: Vec<Edge> = before
                .iter()
                .filter(|(k, _)| !after.contains_key(*k))
                .map(|(_, e)| e.clone())
                .collect();
            if !added.is_empty() || !removed.is_empty() {
                tree_changes.push(TreeChange {
                    scope: scope.clone(),
                    edges_added: added,
                    edges_removed: removed,
                });
            }
        }
        let mut policy_changes = Vec::new();
        for scope in &scopes {
            let before = self.placement.policy(scope).map(|p| p.regions.clone());
            let after = new.placement.policy(scope).map(|p| p.regions.clone());
            if before != after {
                let (b, a) = (
                    before.clone().unwrap_or_default(),
                    after.clone().unwrap_or_default(),
                );
                policy_changes.push(PolicyChange {
                    policy: scope.clone(),
                    change: match (&before, &after) {
                        (None, _) => "added",
                        (_, None) => "removed",
                        _ => "regions changed",
                    },
                    regions_added: a.difference(&b).cloned().collect(),
                    regions_removed: b.difference(&a).cloned().collect(),
                });
            }
        }
        // Rows change placement where the policy governing some prefix changes: look
        // at every prefix either file names, and at each table's default.
        let mut points: BTreeSet<(String, String)> = BTreeSet::new();
        for d in [self, new] {
            points.extend(
                d.placement
                    .rules
                    .iter()
                    .map(|r| (r.table.to_string(), r.prefix.clone())),
            );
            points.extend(
                d.placement
                    .home_rules
                    .iter()
                    .map(|r| (r.table.to_string(), r.prefix.clone())),
            );
            points.extend(
                d.placement
                    .table_defaults
                    .keys()
                    .map(|t| (t.to_string(), String::new())),
            );
        }
        let mut placement_changes = Vec::new();
        for (table, prefix) in points {
            let (op, np) = (
                self.scope_of(&table, prefix.as_bytes()),
                new.scope_of(&table, prefix.as_bytes()),
            );
            let (oh, nh) = (
                self.placement.home_of(&table, prefix.as_bytes()),
                new.placement.home_of(&table, prefix.as_bytes()),
            );
            if op != np || oh != nh {
                placement_changes.push(PlacementChange {
                    table,
                    prefix,
                    old_policy: op.clone(),
                    new_policy: np.clone(),
                    old_home: oh.cloned(),
                    new_home: nh.cloned(),
                });
            }
        }
        let names: BTreeSet<&String> = self
            .topology
            .app_profiles
            .keys()
            .chain(new.topology.app_profiles.keys())
            .collect();
        let app_profile_changes = names
            .into_iter()
            .filter_map(|name| {
                let before = self.topology.app_profiles.get(name);
                let after = new.topology.app_profiles.get(name);
                let change = match (before, after) {
                    (None, _) => "added",
                    (_, None) => "removed",
                    (Some(b), Some(a)) if b == a => return None,
                    (Some(b), Some(a)) if b.tables != a.tables || b.policies != a.policies => {
                        "permissions changed"
                    }
                    _ => "routing changed",
                };
                Some(AppProfileChange {
                    name: name.clone(),
                    change,
                    old: before.cloned(),
                    new: after.cloned(),
                })
            })
            .collect();
        Diff {
            replicas_added: new_reps.difference(&old_reps).cloned().collect(),
            replicas_removed: old_reps.difference(&new_reps).cloned().collect(),
            tree_changes,
            policy_changes,
            placement_changes,
            app_profile_changes,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TreeChange {
    pub scope: ScopeId,
    pub edges_added: Vec<Edge>,
    pub edges_removed: Vec<Edge>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyChange {
    pub policy: ScopeId,
    pub change: &'static str,
    pub regions_added: Vec<RegionId>,
    pub regions_removed: Vec<RegionId>,
}

/// Rows under `prefix` of `table` move from one policy (or home) to another.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlacementChange {
    pub table: String,
    pub prefix: String,
    pub old_policy: ScopeId,
    pub new_policy: ScopeId,
    pub old_home: Option<RegionId>,
    pub new_home: Option<RegionId>,
}

/// An app profile added, removed, or changed: its permissions (tables, policies)
/// or, otherwise, how it picks replicas (routing, priority).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AppProfileChange {
    pub name: String,
    /// `added`, `removed`, `permissions changed` or `routing changed` (when both
    /// change, `permissions changed`: the one that decides what a client may do).
    pub change: &'static str,
    pub old: Option<AppProfile>,
    pub new: Option<AppProfile>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diff {
    pub replicas_added: Vec<ReplicaId>,
    pub replicas_removed: Vec<ReplicaId>,
    pub tree_changes: Vec<TreeChange>,
    pub policy_changes: Vec<PolicyChange>,
    pub placement_changes: Vec<PlacementChange>,
    pub app_profile_changes: Vec<AppProfileChange>,
}

impl Diff {
    pub fn is_empty(&self) -> bool {
        self.replicas_added.is_empty()
            && self.replicas_removed.is_empty()
            && self.tree_changes.is_empty()
            && self.policy_changes.is_empty()
            && self.placement_changes.is_empty()
            && self.app_profile_changes.is_empty()
    }
}

/// A change between two versions of the files that can expose or lose data:
/// `pangea topology apply` carries it out only when a flag names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Destructive {
    /// Rows of `table` under `prefix` would be allowed in regions their policy
    /// does not include now (a wider policy, or a restricted one dropped for
    /// `global`).
    WidenResidency {
        table: String,
        prefix: String,
        from: ScopeId,
        to: ScopeId,
    },
    /// A policy gains regions: every row in it may be stored there.
    WidenPolicy {
        policy: ScopeId,
        regions_added: Vec<RegionId>,
    },
    /// A column family leaves a table: its cells are no longer readable.
    DropFamily { table: String, family: String },
}

impl Destructive {
    /// The flag of `pangea topology apply` that allows this change.
    pub fn flag(&self) -> String {
        match self {
            Destructive::WidenResidency { table, prefix, .. } => {
                format!("--widen-residency {table}:{prefix}")
            }
            Destructive::WidenPolicy { policy, .. } => format!("--widen-policy {policy}"),
            Destructive::DropFamily { table, family } => {
                format!("--drop-family {table}:{family}")
            }
        }
    }
}

impl std::fmt::Display for Destructive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Destructive::WidenResidency {
                table,
                prefix,
                from,
                to,
            } => write!(
                f,
                "rows of {table} under {prefix:?} would go from policy {from} to {to}, \
                 which allows regions {from} does not"
            ),
            Destructive::WidenPolicy {
                policy,
                regions_added,
            } => write!(
                f,
                "policy {policy} would gain regions {regions_added:?}: its rows would be stored there"
            ),
            Destructive::DropFamily { table, family } => {
                write!(f, "table {table} would lose column family {family}")
            }
        }
    }
}

impl Deployment {
    /// What going from `self` to `new` would widen or drop (see [`Destructive`]).
    /// Tables and policies that disappear are not listed: a replica that holds rows
    /// of them refuses the change outright (they must be migrated first).
    pub fn destructive_changes(&self, new: &Deployment) -> Vec<Destructive> {
        let mut out = Vec::new();
        let diff = self.diff(new);
        for p in diff.policy_changes {
            // `global` is every region by definition: adding a region widens it.
            let restricted = p.policy.as_str() != crate::placement::GLOBAL_POLICY;
            if restricted
                && self.placement.policy(&p.policy).is_some()
                && !p.regions_added.is_empty()
            {
                out.push(Destructive::WidenPolicy {
                    policy: p.policy,
                    regions_added: p.regions_added,
                });
            }
        }
        for ch in diff.placement_changes {
            let before = self.placement.policy(&ch.old_policy);
            let after = new.placement.policy(&ch.new_policy);
            if let (Some(b), Some(a)) = (before, after)
                && !a.regions.is_subset(&b.regions)
            {
                out.push(Destructive::WidenResidency {
                    table: ch.table,
                    prefix: ch.prefix,
                    from: ch.old_policy,
                    to: ch.new_policy,
                });
            }
        }
        for (table, schema) in &self.placement.schema.tables {
            let Some(kept) = new.placement.schema.table(table) else {
                continue;
            };
            for family in schema.families.keys() {
                if !kept.families.contains_key(family) {
                    out.push(Destructive::DropFamily {
                        table: table.to_string(),
                        family: family.to_string(),
                    });
                }
            }
        }
        out
    }
}
