//! Deep copies of a deployment that share no `Arc` with the original.
//!
//! Names are `Arc<str>`s, cloned into every map key and every frame. Two threads
//! that clone the same `Arc` write the same cache line, and every read of the
//! name's bytes on the other core then misses: the simulator's two shards ran
//! 10-80 % slower that way. Each thread works on its own copy instead.
//!
//! Simulator-only: the node shares one deployment among its threads read-only
//! and never needs this, so it lives here rather than in `pangea-topology`.
//! Row mutations have their deep copy in the core (`RowMutation::detached`),
//! which alone can build one without checking it again.

use pangea_topology::placement::{HomeRule, Placement, Policy, PrefixRule};
use pangea_topology::schema::{Schema, TableSchema};
use pangea_topology::topology::{Region, Replica, Routing, Topology};
use pangea_topology::{Deployment, RegionId, ReplicaId, ScopeId};
use std::collections::HashMap;
use std::sync::Arc;

/// One new `Arc` per distinct name, so that equal names inside the copy still
/// share one (ids compare equal by pointer first).
#[derive(Default)]
struct Fresh(HashMap<Box<str>, Arc<str>>);

impl Fresh {
    fn name(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.0.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        self.0.insert(s.into(), a.clone());
        a
    }

    fn replica(&mut self, id: &ReplicaId) -> ReplicaId {
        ReplicaId::new(self.name(id.as_str()))
    }

    fn region(&mut self, id: &RegionId) -> RegionId {
        RegionId::new(self.name(id.as_str()))
    }

    fn scope(&mut self, id: &ScopeId) -> ScopeId {
        ScopeId::new(self.name(id.as_str()))
    }

    fn topology(&mut self, t: &Topology) -> Topology {
        let mut t = t.clone();
        t.regions = std::mem::take(&mut t.regions)
            .into_iter()
            .map(|(k, r)| {
                let r = Region {
                    name: self.region(&r.name),
                    replicas: r.replicas.iter().map(|id| self.replica(id)).collect(),
                    ..r
                };
                (self.region(&k), r)
            })
            .collect();
        t.replicas = std::mem::take(&mut t.replicas)
            .into_iter()
            .map(|(k, r)| {
                let r = Replica {
                    id: self.replica(&r.id),
                    region: self.region(&r.region),
                    ..r
                };
                (self.replica(&k), r)
            })
            .collect();
        t.links = std::mem::take(&mut t.links)
            .into_iter()
            .map(|((a, b), mut l)| {
                (l.a, l.b) = (self.region(&l.a), self.region(&l.b));
                ((self.region(&a), self.region(&b)), l)
            })
            .collect();
        for p in t.app_profiles.values_mut() {
            if let Routing::Pinned(list) = &mut p.routing {
                for id in list {
                    *id = self.replica(id);
                }
            }
            p.tables = std::mem::take(&mut p.tables)
                .into_iter()
                .map(|(table, access)| (self.name(&table), access))
                .collect();
            if let Some(policies) = &mut p.policies {
                *policies = std::mem::take(policies)
                    .iter()
                    .map(|s| self.scope(s))
                    .collect();
            }
        }
        // Derived from the regions and links, keyed by the copy's own names.
        t.recompute_paths();
        t
    }

    fn schema(&mut self, s: &Schema) -> Schema {
        Schema {
            tables: s
                .tables
                .iter()
                .map(|(name, t)| {
                    let families = t
                        .families
                        .iter()
                        .map(|(f, gc)| (self.name(f), *gc))
                        .collect();
                    let schema = TableSchema {
                        families,
                        partition_key: t.partition_key.clone(),
                        event_time: t.event_time,
                        change_retention_ms: t.change_retention_ms,
                    };
                    (self.name(name), schema)
                })
                .collect(),
        }
    }

    fn placement(&mut self, p: &Placement, shard_groups: u32) -> Placement {
        Placement {
            schema: self.schema(&p.schema),
            policies: p
                .policies
                .iter()
                .map(|(k, pol)| {
                    let pol = Policy::new(
                        self.scope(&pol.name),
                        pol.regions.iter().map(|r| self.region(r)).collect(),
                        shard_groups,
                    );
                    (self.scope(k), pol)
                })
                .collect(),
            table_defaults: p
                .table_defaults
                .iter()
                .map(|(t, s)| (self.name(t), self.scope(s)))
                .collect(),
            rules: p
                .rules
                .iter()
                .map(|r| PrefixRule {
                    table: self.name(&r.table),
                    prefix: r.prefix.clone(),
                    policy: self.scope(&r.policy),
                })
                .collect(),
            home_rules: p
                .home_rules
                .iter()
                .map(|r| HomeRule {
                    table: self.name(&r.table),
                    prefix: r.prefix.clone(),
                    home: self.region(&r.home),
                })
                .collect(),
        }
    }
}

/// An equal deployment that shares no `Arc` with `d`, for a thread of its own
/// (see the module documentation).
pub(crate) fn deployment(d: &Deployment) -> Deployment {
    let mut fresh = Fresh::default();
    Deployment {
        topology: fresh.topology(&d.topology),
        placement: fresh.placement(&d.placement, d.topology.shard_groups),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn reference() -> Deployment {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        Deployment::load(
            &root.join("topology/four-continents.toml"),
            Some(&root.join("topology/placement.toml")),
        )
        .expect("the shipped files load")
    }

    /// Every name of a deployment, with the address of its bytes.
    fn names(d: &Deployment) -> Vec<(String, *const u8)> {
        let mut out = Vec::new();
        let mut add = |s: &str| out.push((s.to_owned(), s.as_ptr()));
        for (k, r) in &d.topology.regions {
            add(k.as_str());
            add(r.name.as_str());
            r.replicas.iter().for_each(|id| add(id.as_str()));
        }
        for (k, r) in &d.topology.replicas {
            add(k.as_str());
            add(r.id.as_str());
            add(r.region.as_str());
        }
        for ((a, b), l) in &d.topology.links {
            for r in [a, b, &l.a, &l.b] {
                add(r.as_str());
            }
        }
        for p in d.topology.app_profiles.values() {
            p.tables.keys().for_each(|t| add(t));
            p.policies.iter().flatten().for_each(|s| add(s.as_str()));
        }
        for (t, ts) in &d.placement.schema.tables {
            add(t);
            ts.families.keys().for_each(|f| add(f));
        }
        for (k, p) in &d.placement.policies {
            add(k.as_str());
            add(p.name.as_str());
            p.regions.iter().for_each(|r| add(r.as_str()));
        }
        for (t, s) in &d.placement.table_defaults {
            add(t);
            add(s.as_str());
        }
        for r in &d.placement.rules {
            add(&r.table);
            add(r.policy.as_str());
        }
        for r in &d.placement.home_rules {
            add(&r.table);
            add(r.home.as_str());
        }
        out
    }

    #[test]
    fn a_detached_deployment_is_equal_and_shares_no_name() {
        let mut d = reference();
        // A profile restricted to policies, by the placement's own ids (shared `Arc`s).
        let policies = d.placement.policies.keys().cloned().collect();
        d.topology
            .app_profiles
            .get_mut("frontend")
            .expect("the reference has a frontend profile")
            .policies = Some(policies);
        let copy = deployment(&d);
        assert_eq!(copy, d);
        assert!(!d.placement.rules.is_empty() && !d.placement.home_rules.is_empty());
        let (old, new) = (names(&d), names(&copy));
        assert_eq!(old.len(), new.len());
        let old_ptrs: std::collections::HashSet<_> = old.iter().map(|(_, p)| *p).collect();
        for (name, p) in &new {
            assert!(!old_ptrs.contains(p), "{name} is shared with the original");
        }
        // Inside the copy, each distinct name is one allocation.
        let mut by_name: HashMap<&str, *const u8> = HashMap::new();
        for (name, p) in &new {
            assert_eq!(
                *by_name.entry(name).or_insert(*p),
                *p,
                "{name} is copied twice"
            );
        }
    }
}
