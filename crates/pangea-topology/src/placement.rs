//! The validated placement: tables and families (the [`Schema`]), placement policies
//! (sets of regions), and the rules that map a table and a row-key prefix to a policy
//! and to a home region.
//!
//! Every policy is a replication scope with its own tree; `global` (every region) is
//! built in. A row's policy is the policy of the longest matching prefix rule of its
//! table, else the table's default policy.

use crate::ids::{RegionId, ScopeId};
use crate::problems::{KeyPath, Problem, ProblemKind, Problems, Source};
use crate::raw::RawPlacement;
use crate::schema::{EventTimeWindow, FamilyKind, GcPolicy, Schema, TableSchema, validate_name};
use crate::shard::{GroupId, PartitionKey};
use crate::topology::{Topology, region_components};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The built-in policy that allows every region.
pub const GLOBAL_POLICY: &str = "global";

/// Longest change-stream retention a table may ask for: every replica keeps
/// every log entry of its scopes this long.
pub const CHANGE_RETENTION_MAX_MS: u64 = 30 * 86_400_000;

/// A placement policy: the regions whose replicas may hold its rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Policy {
    pub name: ScopeId,
    pub regions: BTreeSet<RegionId>,
    /// The replication scope of each shard group of the policy's rows, by group
    /// (`[name]` in a deployment of one group): named once, shared by every row.
    #[serde(skip)]
    scopes: Arc<[ScopeId]>,
}

impl Policy {
    /// A policy of a deployment of `shard_groups` groups.
    pub fn new(name: ScopeId, regions: BTreeSet<RegionId>, shard_groups: u32) -> Policy {
        let scopes = (0..shard_groups.max(1))
            .map(|g| ScopeId::of_group(&name, shard_groups, GroupId(g)))
            .collect();
        Policy {
            name,
            regions,
            scopes,
        }
    }

    /// The replication scope of group `g` of the policy's rows (group 0 past the
    /// last group).
    pub fn scope(&self, g: GroupId) -> &ScopeId {
        self.scopes.get(g.0 as usize).unwrap_or(&self.scopes[0])
    }

    /// Every replication scope of the policy's rows, by group.
    pub fn scopes(&self) -> &[ScopeId] {
        &self.scopes
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PrefixRule {
    pub table: Arc<str>,
    pub prefix: String,
    pub policy: ScopeId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HomeRule {
    pub table: Arc<str>,
    pub prefix: String,
    pub home: RegionId,
}

/// A validated placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub schema: Schema,
    /// Includes `global`.
    pub policies: BTreeMap<ScopeId, Policy>,
    pub table_defaults: BTreeMap<Arc<str>, ScopeId>,
    /// Sorted by (table, prefix).
    pub rules: Vec<PrefixRule>,
    pub home_rules: Vec<HomeRule>,
}

/// System tables every deployment has: location metadata (`_location`) and placement
/// migration jobs (`_jobs`), both replicated in the global scope.
pub const SYSTEM_TABLES: [(&str, &str); 2] = [("_location", "l"), ("_jobs", "j")];

fn add_system_tables(schema: &mut Schema) {
    for (table, family) in SYSTEM_TABLES {
        let families = BTreeMap::from([(
            Arc::from(family),
            GcPolicy {
                max_versions: Some(1),
                ..GcPolicy::default()
            },
        )]);
        schema.tables.insert(
            table.into(),
            TableSchema {
                families,
                partition_key: None,
                event_time: None,
                change_retention_ms: None,
            },
        );
    }
}

/// Parses `"500ms"`, `"90s"`, `"30m"`, `"12h"`, `"30d"` into milliseconds.
pub fn parse_duration_ms(s: &str) -> Option<u64> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(ms)
}

/// Whether `name` is the table `table`: the same bytes (by address when `table`
/// is a clone of the placement's name, as the callers on hot paths hand in).
fn same_table(name: &str, table: &str) -> bool {
    std::ptr::eq(name, table) || name == table
}

fn longest<'a, T>(
    items: impl Iterator<Item = &'a T>,
    prefix_of: impl Fn(&T) -> &str,
    key: &[u8],
) -> Option<&'a T>
where
    T: 'a,
{
    items
        .filter(|r| key.starts_with(prefix_of(r).as_bytes()))
        .max_by_key(|r| prefix_of(r).len())
}

impl Placement {
    /// A placement with no tables and only the global policy, for a topology alone.
    pub fn global_only(topology: &Topology) -> Placement {
        let global = Policy::new(
            ScopeId::global(),
            topology.all_regions(),
            topology.shard_groups,
        );
        let mut schema = Schema::default();
        add_system_tables(&mut schema);
        Placement {
            schema,
            policies: BTreeMap::from([(ScopeId::global(), global)]),
            table_defaults: BTreeMap::new(),
            rules: Vec::new(),
            home_rules: Vec::new(),
        }
    }

    pub(crate) fn from_raw(
        raw: RawPlacement,
        topology: &Topology,
        src: &Source,
    ) -> Result<Placement, Problems> {
        let mut problems: Vec<Problem> = Vec::new();
        let root = KeyPath::root();
        let mut p = |kind, key: &KeyPath, msg: String| problems.push(src.problem(kind, key, msg));

        let mut policies = Placement::global_only(topology).policies;
        for (i, pol) in raw.policies.iter().enumerate() {
            let k = root.key("policies").index(i);
            if let Err(e) = validate_name("policy", &pol.name) {
                p(ProblemKind::InvalidName, &k.key("name"), e.to_string());
            }
            let name = ScopeId::new(pol.name.as_str());
            if policies.contains_key(&name) {
                let what = if pol.name == GLOBAL_POLICY {
                    " (`global` is built in)"
                } else {
                    ""
                };
                p(
                    ProblemKind::Duplicate,
                    &k.key("name"),
                    format!("policy {:?} is defined twice{what}", pol.name),
                );
                continue;
            }
            if pol.regions.is_empty() {
                p(
                    ProblemKind::InvalidValue,
                    &k.key("regions"),
                    format!("policy {:?} allows no region", pol.name),
                );
            }
            let mut regions = BTreeSet::new();
            for (j, r) in pol.regions.iter().enumerate() {
                let id = RegionId::new(r.as_str());
                if !topology.regions.contains_key(&id) {
                    p(
                        ProblemKind::UnknownReference,
                        &k.key("regions").index(j),
                        format!("unknown region {r:?}"),
                    );
                } else if !regions.insert(id) {
                    p(
                        ProblemKind::Duplicate,
                        &k.key("regions").index(j),
                        format!("region {r:?} listed twice"),
                    );
                }
            }
            // The policy's rows travel only between its own regions, so those must be
            // connected by links among themselves.
            let inside: BTreeMap<_, _> = topology
                .regions
                .iter()
                .filter(|(id, _)| regions.contains(*id))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let groups = region_components(&inside, &topology.links);
            if groups.len() > 1 {
                let names: Vec<String> = groups
                    .iter()
                    .map(|g| {
                        format!(
                            "{{{}}}",
                            g.iter()
                                .map(RegionId::as_str)
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    })
                    .collect();
                p(
                    ProblemKind::PolicyDisconnected,
                    &k.key("regions"),
                    format!(
                        "policy {:?}: its regions cannot reach each other without leaving the policy; groups: {}",
                        pol.name,
                        names.join(" ")
                    ),
                );
            }
            policies.insert(
                name.clone(),
                Policy::new(name, regions, topology.shard_groups),
            );
        }

        let mut schema = Schema::default();
        add_system_tables(&mut schema);
        let mut table_defaults = BTreeMap::new();
        for (i, t) in raw.tables.iter().enumerate() {
            let k = root.key("tables").index(i);
            if let Err(e) = validate_name("table", &t.name) {
                p(ProblemKind::InvalidName, &k.key("name"), e.to_string());
            }
            let name: Arc<str> = t.name.as_str().into();
            if t.name.starts_with('_') {
                p(
                    ProblemKind::InvalidName,
                    &k.key("name"),
                    format!(
                        "table names starting with '_' are reserved for system tables ({:?})",
                        t.name
                    ),
                );
                continue;
            }
            if schema.tables.contains_key(&name) {
                p(
                    ProblemKind::Duplicate,
                    &k.key("name"),
                    format!("table {:?} is defined twice", t.name),
                );
                continue;
            }
            if !policies.contains_key(t.default_policy.as_str()) {
                p(
                    ProblemKind::UnknownReference,
                    &k.key("default_policy"),
                    format!("unknown policy {:?}", t.default_policy),
                );
            }
            if t.families.is_empty() {
                p(
                    ProblemKind::MissingField,
                    &k.key("families"),
                    format!("table {:?} has no column family", t.name),
                );
            }
            let mut families = BTreeMap::new();
            for (j, f) in t.families.iter().enumerate() {
                let fk = k.key("families").index(j);
                if let Err(e) = validate_name("family", &f.name) {
                    p(ProblemKind::InvalidName, &fk.key("name"), e.to_string());
                }
                let max_versions = match f.max_versions {
                    Some(n) if n < 1 || n > i64::from(u32::MAX) => {
                        p(
                            ProblemKind::InvalidValue,
                            &fk.key("max_versions"),
                            format!("max_versions must be ≥ 1, got {n}"),
                        );
                        None
                    }
                    n => n.map(|n| n as u32),
                };
                let ttl_ms = match f.ttl.as_deref().map(|s| (s, parse_duration_ms(s))) {
                    Some((s, None)) => {
                        p(
                            ProblemKind::InvalidValue,
                            &fk.key("ttl"),
                            format!("ttl {s:?} is not a duration like \"90s\", \"12h\", \"30d\""),
                        );
                        None
                    }
                    Some((_, Some(0))) => {
                        p(
                            ProblemKind::InvalidValue,
                            &fk.key("ttl"),
                            "ttl must be > 0".into(),
                        );
                        None
                    }
                    Some((_, ms)) => ms,
                    None => None,
                };
                let kind = match f.kind.as_deref() {
                    None | Some("cells") => FamilyKind::Cells,
                    Some("counter") => FamilyKind::Counter,
                    Some(other) => {
                        p(
                            ProblemKind::InvalidValue,
                            &fk.key("type"),
                            format!("type {other:?} is not \"cells\" or \"counter\""),
                        );
                        FamilyKind::Cells
                    }
                };
                if kind == FamilyKind::Counter && max_versions.is_some() {
                    p(
                        ProblemKind::InvalidValue,
                        &fk.key("max_versions"),
                        "a counter family keeps no versions to limit: its cells are sums \
                         (drop max_versions, or use ttl to forget old increments)"
                            .into(),
                    );
                }
                if families
                    .insert(
                        Arc::from(f.name.as_str()),
                        GcPolicy {
                            max_versions,
                            ttl_ms,
                            kind,
                        },
                    )
                    .is_some()
                {
                    p(
                        ProblemKind::Duplicate,
                        &fk.key("name"),
                        format!("family {:?} is defined twice", f.name),
                    );
                }
            }
            let partition_key = t.partition_key.as_ref().and_then(|pk| {
                let kk = k.key("partition_key");
                let separator = match pk.separator.as_bytes() {
                    [b] if b.is_ascii() => Some(*b),
                    _ => {
                        p(
                            ProblemKind::InvalidValue,
                            &kk.key("separator"),
                            format!(
                                "separator must be one ASCII character, got {:?}",
                                pk.separator
                            ),
                        );
                        None
                    }
                };
                let fields = match pk.fields {
                    n if n >= 1 && n <= i64::from(u32::MAX) => Some(n as u32),
                    n => {
                        p(
                            ProblemKind::InvalidValue,
                            &kk.key("fields"),
                            format!("fields must be ≥ 1, got {n}"),
                        );
                        None
                    }
                };
                Some(PartitionKey {
                    separator: separator?,
                    fields: fields?,
                })
            });
            let event_time = t.event_time.as_ref().and_then(|et| {
                let ek = k.key("event_time");
                let mut duration = |field: &str, text: &str, max: u64, max_text: &str| {
                    let ms = parse_duration_ms(text).filter(|ms| *ms <= max);
                    if ms.is_none() {
                        p(
                            ProblemKind::InvalidValue,
                            &ek.key(field),
                            format!(
                                "{field} {text:?} is not a duration like \"90s\", \"12h\", \"30d\" \
                                 of at most {max_text}"
                            ),
                        );
                    }
                    ms
                };
                let past = duration("past", &et.past, EventTimeWindow::PAST_MAX_MS, "3650d");
                let future = match &et.future {
                    Some(f) => duration("future", f, EventTimeWindow::FUTURE_MAX_MS, "1h"),
                    None => Some(EventTimeWindow::FUTURE_DEFAULT_MS),
                };
                Some(EventTimeWindow {
                    past_ms: past?,
                    future_ms: future?,
                })
            });
            let change_retention_ms = t.changes.as_ref().and_then(|c| {
                let ms = parse_duration_ms(&c.retention)
                    .filter(|ms| (1_000..=CHANGE_RETENTION_MAX_MS).contains(ms));
                if ms.is_none() {
                    p(
                        ProblemKind::InvalidValue,
                        &k.key("changes").key("retention"),
                        format!(
                            "retention {:?} is not a duration like \"1h\", \"24h\", \"7d\" \
                             of 1s to 30d",
                            c.retention
                        ),
                    );
                }
                ms
            });
            table_defaults.insert(name.clone(), ScopeId::new(t.default_policy.as_str()));
            schema.tables.insert(
                name,
                TableSchema {
                    families,
                    partition_key,
                    event_time,
                    change_retention_ms,
                },
            );
        }

        let mut rules: Vec<PrefixRule> = Vec::new();
        for (i, r) in raw.rules.iter().enumerate() {
            let k = root.key("rules").index(i);
            if !schema.tables.contains_key(r.table.as_str()) {
                p(
                    ProblemKind::UnknownReference,
                    &k.key("table"),
                    format!("unknown table {:?}", r.table),
                );
            }
            if !policies.contains_key(r.policy.as_str()) {
                p(
                    ProblemKind::UnknownReference,
                    &k.key("policy"),
                    format!("unknown policy {:?}", r.policy),
                );
            }
            if rules
                .iter()
                .any(|o| *o.table == *r.table && o.prefix == r.prefix)
            {
                p(
                    ProblemKind::Duplicate,
                    &k.key("prefix"),
                    format!(
                        "table {:?} has two rules for prefix {:?}",
                        r.table, r.prefix
                    ),
                );
                continue;
            }
            rules.push(PrefixRule {
                table: r.table.as_str().into(),
                prefix: r.prefix.clone(),
                policy: ScopeId::new(r.policy.as_str()),
            });
        }
        rules.sort_by(|a, b| (&a.table, &a.prefix).cmp(&(&b.table, &b.prefix)));

        let mut home_rules: Vec<HomeRule> = Vec::new();
        let mut placement_so_far = Placement {
            schema: schema.clone(),
            policies: policies.clone(),
            table_defaults: table_defaults.clone(),
            rules: rules.clone(),
            home_rules: Vec::new(),
        };
        for (i, h) in raw.home_rules.iter().enumerate() {
            let k = root.key("home_rules").index(i);
            if !schema.tables.contains_key(h.table.as_str()) {
                p(
                    ProblemKind::UnknownReference,
                    &k.key("table"),
                    format!("unknown table {:?}", h.table),
                );
                continue;
            }
            let home = RegionId::new(h.home.as_str());
            if !topology.regions.contains_key(&home) {
                p(
                    ProblemKind::UnknownReference,
                    &k.key("home"),
                    format!("unknown region {:?}", h.home),
                );
                continue;
            }
            if home_rules
                .iter()
                .any(|o| *o.table == *h.table && o.prefix == h.prefix)
            {
                p(
                    ProblemKind::Duplicate,
                    &k.key("prefix"),
                    format!(
                        "table {:?} has two home rules for prefix {:?}",
                        h.table, h.prefix
                    ),
                );
                continue;
            }
            // The home must be allowed for every row under the prefix: by the prefix's
            // own policy and by any longer rule inside it.
            let mut governing = vec![
                placement_so_far
                    .policy_of(&h.table, h.prefix.as_bytes())
                    .clone(),
            ];
            governing.extend(
                placement_so_far
                    .rules
                    .iter()
                    .filter(|r| *r.table == *h.table && r.prefix.starts_with(&h.prefix))
                    .map(|r| r.policy.clone()),
            );
            governing.sort();
            governing.dedup();
            for pol in governing {
                if let Some(policy) = policies.get(&pol)
                    && !policy.regions.contains(&home)
                {
                    p(
                        ProblemKind::InvalidValue,
                        &k.key("home"),
                        format!(
                            "home region {:?} is outside policy {:?}, which governs rows under prefix {:?}",
                            h.home,
                            pol.as_str(),
                            h.prefix
                        ),
                    );
                }
            }
            home_rules.push(HomeRule {
                table: h.table.as_str().into(),
                prefix: h.prefix.clone(),
                home,
            });
        }
        home_rules.sort_by(|a, b| (&a.table, &a.prefix).cmp(&(&b.table, &b.prefix)));

        if !problems.is_empty() {
            problems.sort_by_key(|p| p.line.unwrap_or(0));
            return Err(Problems(problems));
        }
        placement_so_far.home_rules = home_rules;
        Ok(placement_so_far)
    }

    /// The policy (= replication scope) of a row.
    pub fn policy_of(&self, table: &str, key: &[u8]) -> &ScopeId {
        let rule = longest(
            self.rules.iter().filter(|r| same_table(&r.table, table)),
            |r| &r.prefix,
            key,
        );
        match rule {
            Some(r) => &r.policy,
            // The few tables in a row, each compared by address first.
            None => self
                .table_defaults
                .iter()
                .find(|(t, _)| same_table(t, table))
                .map_or_else(|| &self.policies[GLOBAL_POLICY].name, |(_, s)| s),
        }
    }

    /// The region a row's reads should go to, if a home rule names one.
    pub fn home_of(&self, table: &str, key: &[u8]) -> Option<&RegionId> {
        longest(
            self.home_rules
                .iter()
                .filter(|r| same_table(&r.table, table)),
            |r| &r.prefix,
            key,
        )
        .map(|r| &r.home)
    }

    /// The policy of a policy's name or of one of its replication scopes.
    pub fn policy(&self, scope: &ScopeId) -> Option<&Policy> {
        self.policies.get(scope.policy())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("500ms"), Some(500));
        assert_eq!(parse_duration_ms("90s"), Some(90_000));
        assert_eq!(parse_duration_ms("30d"), Some(2_592_000_000));
        assert_eq!(parse_duration_ms("30"), None);
        assert_eq!(parse_duration_ms("d"), None);
        assert_eq!(parse_duration_ms("3w"), None);
    }
}
