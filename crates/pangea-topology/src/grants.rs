//! App profile grants checked against the placement: the topology file names tables
//! and placement policies that only the placement file defines, so this runs where
//! both are loaded ([`crate::Deployment::load`]). Problems point at the topology
//! file's lines, since that is where the grant is written.

use crate::ids::{RegionId, ScopeId};
use crate::placement::Placement;
use crate::problems::{KeyPath, Problem, ProblemKind, Source};
use crate::raw::RawAppProfile;
use crate::topology::{Routing, Topology};
use std::collections::BTreeSet;

/// Every problem of the profiles' grants against `placement`. `raw` is what the
/// validated `topology` was built from (it keeps the file's order, for key paths).
pub(crate) fn check(
    raw: &[RawAppProfile],
    topology: &Topology,
    placement: &Placement,
    src: &Source,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut p = |kind, key: &KeyPath, msg: String| problems.push(src.problem(kind, key, msg));
    let defined = || {
        let names: Vec<&str> = placement.schema.user_tables().map(|t| &**t).collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    };
    for (i, a) in raw.iter().enumerate() {
        let ak = KeyPath::root().key("app_profiles").index(i);
        // A validated topology has every raw profile, under its name.
        let Some(profile) = topology.app_profiles.get(&a.name) else {
            continue;
        };
        for table in a.tables.iter().flat_map(|t| t.keys()) {
            if placement.schema.table(table).is_none() {
                p(
                    ProblemKind::UnknownReference,
                    &ak.key("tables").key(table),
                    format!(
                        "app profile {:?} grants unknown table {table:?}; the placement defines: {}",
                        a.name,
                        defined()
                    ),
                );
            }
        }
        let Some(listed) = &a.policies else { continue };
        let mut all_known = true;
        for (j, name) in listed.iter().enumerate() {
            if placement.policy(&ScopeId::new(name.as_str())).is_none() {
                all_known = false;
                p(
                    ProblemKind::UnknownReference,
                    &ak.key("policies").index(j),
                    format!("unknown policy {name:?}"),
                );
            }
        }
        // An empty list is reported with the topology alone.
        if let (Routing::Pinned(pinned), Some(policies), true) =
            (&profile.routing, &profile.policies, all_known)
            && !policies.is_empty()
        {
            let regions: BTreeSet<&RegionId> = policies
                .iter()
                .filter_map(|s| placement.policy(s))
                .flat_map(|pol| &pol.regions)
                .collect();
            let inside = pinned
                .iter()
                .filter_map(|id| topology.replica(id.as_str()))
                .any(|r| regions.contains(&r.region));
            if !inside {
                let list = |v: Vec<&str>| v.join(", ");
                p(
                    ProblemKind::ProfileReachesNothing,
                    &ak.key("policies"),
                    format!(
                        "app profile {:?} is pinned to replicas ({}) outside every region of its policies ({}): it could never read a row",
                        a.name,
                        list(pinned.iter().map(|r| r.as_str()).collect()),
                        list(policies.iter().map(|s| s.as_str()).collect()),
                    ),
                );
            }
        }
    }
    problems
}
