//! Shard groups: how rows spread over the processes of one replica.
//!
//! A deployment has a fixed number `G` of shard groups (`shard_groups` in the
//! topology file, default 1). A row belongs to one group, chosen from its
//! **partition key** — its row key, or the prefix a table declares
//! (`partition_key` in the placement file) — so that rows sharing a partition key
//! (one user's events, say) share a group. Each replica runs `processes` processes
//! (default 1) and each hosts a contiguous range of groups. Specified in
//! docs/sharding.md, with test vectors, so a client in any language maps a key to
//! the process that serves it:
//!
//! 1. partition key: the row key up to, not including, the `fields`-th
//!    occurrence of the table's separator; the whole row key if it has fewer
//!    (or if the table declares none);
//! 2. group `g = xxh3_64(partition key) mod G` (XXH3 64-bit, default secret);
//! 3. in a replica of `P` processes, process `p` hosts the groups `g` with
//!    `g · P / G = p` (integer division): contiguous ranges whose sizes differ by
//!    at most one.

use serde::Serialize;
use std::ops::Range;
use xxhash_rust::xxh3::xxh3_64;

/// Most shard groups a deployment may have. Each group a process hosts costs it
/// a replication state machine; 4,096 keeps that bounded on any host.
pub const SHARD_GROUPS_MAX: u32 = 4_096;

/// A shard group: `0 .. shard_groups`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct GroupId(pub u32);

impl std::fmt::Display for GroupId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "g{}", self.0)
    }
}

/// Which prefix of a table's row keys is its partition key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionKey {
    /// The byte that separates the key's fields (e.g. `,` in
    /// `app_id,user_token,timestamp`).
    pub separator: u8,
    /// How many leading fields form the partition key (≥ 1).
    pub fields: u32,
}

impl PartitionKey {
    /// The partition key of `row_key` (step 1 of the module documentation).
    pub fn of<'k>(&self, row_key: &'k [u8]) -> &'k [u8] {
        let mut seen = 0;
        for (i, &b) in row_key.iter().enumerate() {
            if b == self.separator {
                seen += 1;
                if seen == self.fields {
                    return &row_key[..i];
                }
            }
        }
        row_key
    }
}

/// The partition key of `row_key` in a table that declares `spec` (or none).
pub fn partition_key<'k>(spec: Option<&PartitionKey>, row_key: &'k [u8]) -> &'k [u8] {
    spec.map_or(row_key, |s| s.of(row_key))
}

/// The group of a partition key among `groups` (step 2).
pub fn group_of(groups: u32, partition_key: &[u8]) -> GroupId {
    debug_assert!(groups >= 1);
    GroupId((xxh3_64(partition_key) % u64::from(groups.max(1))) as u32)
}

/// The process, of `processes`, that hosts `group` of `groups` (step 3).
pub fn process_of(groups: u32, processes: u32, group: GroupId) -> u32 {
    debug_assert!(processes >= 1 && processes <= groups && group.0 < groups);
    (u64::from(group.0) * u64::from(processes) / u64::from(groups.max(1))) as u32
}

/// The groups process `process` of `processes` hosts: the inverse of
/// [`process_of`].
pub fn groups_of_process(groups: u32, processes: u32, process: u32) -> Range<u32> {
    // The smallest g with g·P/G ≥ p is ceil(p·G/P).
    let first = |p: u32| (u64::from(p) * u64::from(groups)).div_ceil(u64::from(processes)) as u32;
    first(process)..first(process + 1).min(groups)
}

/// How a deployment's replicas split the shard groups over their processes:
/// the distinct process counts above one. Two groups of the same
/// [`ProcessLayout::class`] are hosted by one process in every replica, so one
/// request can read rows of both wherever it is sent; with every replica one
/// process, every group is in one class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessLayout {
    groups: u32,
    counts: Vec<u32>,
}

impl ProcessLayout {
    /// Whether some replica runs more than one process.
    pub fn is_split(&self) -> bool {
        !self.counts.is_empty()
    }

    /// The process hosting `group` under each distinct process count.
    pub fn class(&self, group: GroupId) -> Vec<u32> {
        self.counts
            .iter()
            .map(|&p| process_of(self.groups, p, group))
            .collect()
    }
}

/// Tries this many suffixes per group in [`crate::Deployment::key_in_group`]:
/// each lands in a given group with chance 1/G, so a miss is (1 − 1/G)^(64·G),
/// below e^−64.
const KEY_SEARCH_PER_GROUP: u32 = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_key_is_the_declared_number_of_leading_fields() {
        let two = PartitionKey {
            separator: b',',
            fields: 2,
        };
        assert_eq!(two.of(b"app,user,1700000000"), b"app,user");
        assert_eq!(two.of(b"app,user,"), b"app,user");
        assert_eq!(
            two.of(b"app,user"),
            b"app,user",
            "fewer separators: the whole key"
        );
        assert_eq!(two.of(b"app"), b"app");
        assert_eq!(two.of(b",,x"), b",");
        let one = PartitionKey {
            separator: b'#',
            fields: 1,
        };
        assert_eq!(one.of(b"user#event"), b"user");
        assert_eq!(one.of(b"#event"), b"");
        assert_eq!(partition_key(None, b"a,b,c"), b"a,b,c");
    }

    /// The vectors of docs/sharding.md: a client in another language must get
    /// these groups.
    #[test]
    fn groups_match_the_documented_vectors() {
        for (key, groups, group) in [
            (&b"user:1"[..], 1, 0),
            (b"user:1", 64, 1),
            (b"user:2", 64, 2),
            (b"app,user-7", 64, 10),
            (b"", 64, 2),
            (b"user:1", 4096, 1281),
        ] {
            // The hashes themselves, as docs/sharding.md lists them.
            let hash = match key {
                b"user:1" => 0x3b57_7afd_7fed_9501,
                b"user:2" => 0x69a0_366b_760b_5c02,
                b"app,user-7" => 0x9811_5c0f_2855_3a8a,
                _ => 0x2d06_8005_38d3_94c2,
            };
            assert_eq!(xxh3_64(key), hash);
            assert_eq!(
                group_of(groups, key),
                GroupId(group),
                "{:?} of {groups}",
                String::from_utf8_lossy(key)
            );
        }
    }

    #[test]
    fn processes_host_contiguous_ranges_that_cover_every_group_once() {
        for groups in [1, 2, 3, 7, 64, 100, 4096] {
            for processes in [1, 2, 3, 4, 7, 16, 64].into_iter().filter(|p| *p <= groups) {
                let mut next = 0;
                let (mut smallest, mut largest) = (u32::MAX, 0);
                for p in 0..processes {
                    let range = groups_of_process(groups, processes, p);
                    assert_eq!(range.start, next, "G={groups} P={processes} p={p}");
                    for g in range.clone() {
                        assert_eq!(process_of(groups, processes, GroupId(g)), p);
                    }
                    smallest = smallest.min(range.len() as u32);
                    largest = largest.max(range.len() as u32);
                    next = range.end;
                }
                assert_eq!(next, groups, "G={groups} P={processes}: every group hosted");
                assert!(
                    largest - smallest <= 1,
                    "G={groups} P={processes}: balanced"
                );
            }
        }
    }

    #[test]
    fn keys_spread_evenly_over_groups() {
        let groups = 64;
        let mut count = vec![0u32; groups as usize];
        for i in 0..64_000 {
            count[group_of(groups, format!("user:{i}").as_bytes()).0 as usize] += 1;
        }
        // 1,000 expected per group; ±15 % is over 4.5 standard deviations.
        for (g, c) in count.iter().enumerate() {
            assert!(
                (850..=1150).contains(c),
                "group {g} holds {c} of 64,000 keys"
            );
        }
    }
}

/// The processes of one replica and the groups each hosts, as `topology plan`
/// shows them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplicaShards {
    pub replica: crate::ReplicaId,
    /// Process `i` hosts `groups[i]`.
    pub groups: Vec<Range<u32>>,
}

impl crate::Deployment {
    /// The deployment's [`ProcessLayout`].
    pub fn process_layout(&self) -> ProcessLayout {
        let counts: std::collections::BTreeSet<u32> = self
            .topology
            .replicas
            .values()
            .map(|r| r.serving_processes())
            .filter(|&p| p > 1)
            .collect();
        ProcessLayout {
            groups: self.topology.shard_groups,
            counts: counts.into_iter().collect(),
        }
    }

    /// A row key of `table` starting with `prefix` in shard group `group`: what a
    /// client routes by to reach the process hosting that group of a scan whose
    /// prefix does not fix one. `None` only if no suffix of the search lands there
    /// (vanishingly unlikely: [`KEY_SEARCH_PER_GROUP`]).
    pub fn key_in_group(&self, table: &str, prefix: &[u8], group: GroupId) -> Option<Vec<u8>> {
        let mut key = prefix.to_vec();
        for n in 0..KEY_SEARCH_PER_GROUP * self.topology.shard_groups.max(1) {
            key.truncate(prefix.len());
            key.extend_from_slice(n.to_string().as_bytes());
            if self.group_of(table, &key) == group {
                return Some(key);
            }
        }
        None
    }

    /// Every replica's processes and the groups each serves, in replica id order.
    pub fn shards(&self) -> Vec<ReplicaShards> {
        let g = self.topology.shard_groups;
        self.topology
            .replicas
            .values()
            .filter(|r| r.index == 0)
            .map(|r| ReplicaShards {
                replica: r.id.clone(),
                groups: (0..r.process_count())
                    .map(|p| groups_of_process(g, r.serving_processes(), p))
                    .collect(),
            })
            .collect()
    }

    /// This deployment with its rows spread over `groups` shard groups instead
    /// of the topology file's: every policy replicates as `groups` scopes. For a
    /// drill that rehearses a deployment's files at another G; refused (saying
    /// why) outside `1 ..= SHARD_GROUPS_MAX` or below a replica's `processes`.
    pub fn with_shard_groups(mut self, groups: u32) -> Result<crate::Deployment, String> {
        if !(1..=SHARD_GROUPS_MAX).contains(&groups) {
            return Err(format!(
                "shard_groups must be 1 ..= {SHARD_GROUPS_MAX}, got {groups}"
            ));
        }
        if let Some(r) = self
            .topology
            .replicas
            .values()
            .find(|r| r.processes > groups)
        {
            return Err(format!(
                "shard_groups = {groups} is below replica {}'s {} processes (each hosts a \
                 group at least)",
                r.id, r.processes
            ));
        }
        self.topology.shard_groups = groups;
        for p in self.placement.policies.values_mut() {
            *p = crate::Policy::new(p.name.clone(), std::mem::take(&mut p.regions), groups);
        }
        Ok(self)
    }

    /// Changes from `self` to `new` that would move rows between shard groups, or
    /// groups between processes other than by a resize's next step. The number
    /// of groups and a table's partition key are fixed once chosen (every row
    /// would change group); a replica's process count changes only through the
    /// steps of a resize (`pangea cluster resize`, docs/sharding.md), one at a
    /// time: start (P → copy from P), serve (copy → serve), finish (serve → the
    /// new count alone), or abandon before serving (copy → P). Nor may a
    /// family change type (cells, counter), nor a table's event-time window
    /// narrow. Empty: the change may be applied.
    pub fn layout_changes(&self, new: &crate::Deployment) -> Vec<String> {
        let mut out = Vec::new();
        let (old_g, new_g) = (self.topology.shard_groups, new.topology.shard_groups);
        if old_g != new_g {
            out.push(format!(
                "shard_groups would change from {old_g} to {new_g}: it is fixed once a \
                 deployment is running (every row would change group)"
            ));
        }
        for (table, schema) in &self.placement.schema.tables {
            let Some(kept) = new.placement.schema.table(table) else {
                continue;
            };
            if kept.partition_key != schema.partition_key {
                out.push(format!(
                    "the partition key of table {table} would change: it is fixed once \
                     the table exists (its rows would change group)"
                ));
            }
            for (family, gc) in &schema.families {
                let Some(now) = kept.families.get(family).filter(|k| k.kind != gc.kind) else {
                    continue;
                };
                let name = |k: crate::schema::FamilyKind| match k {
                    crate::schema::FamilyKind::Cells => "cells",
                    crate::schema::FamilyKind::Counter => "counter",
                };
                out.push(format!(
                    "family {family} of table {table} would change type from {} to {}: a \
                     family's type is fixed once it exists (its stored cells would be read \
                     as the other kind); add a family of the new type under a new name",
                    name(gc.kind),
                    name(now.kind)
                ));
            }
            // Rows are compacted `past` behind the purge horizon because a write
            // stamped that far back may still be on its way; a narrower window
            // would purge tombstones such a write needs.
            let past = |t: &crate::schema::TableSchema| t.event_time.map_or(0, |w| w.past_ms);
            if past(kept) < past(schema) {
                out.push(format!(
                    "the event_time window of table {table} would reach {} ms back instead \
                     of {} ms: it may widen, never narrow (writes stamped up to the old \
                     window may still be in flight, and tombstones they need would be purged)",
                    past(kept),
                    past(schema)
                ));
            }
        }
        for (id, r) in self.topology.replicas.iter().filter(|(_, r)| r.index == 0) {
            let Some(kept) = new.topology.replica(id.as_str()) else {
                continue;
            };
            if !resize_step(r, kept) {
                out.push(format!(
                    "replica {id} would go from {} to {}: a replica's processes change \
                     only by the steps of `pangea cluster resize` (docs/sharding.md)",
                    layout_name(r),
                    layout_name(kept)
                ));
            }
        }
        out
    }
}

/// A replica's process layout as an operator reads it.
fn layout_name(r: &crate::Replica) -> String {
    match r.resize {
        None => format!("{} processes", r.processes),
        Some(z) => format!(
            "a resize from {} to {} processes (phase {})",
            z.from,
            r.processes,
            z.phase.name()
        ),
    }
}

/// Whether `new` is `old`'s layout or the next (or abandoning) step of a resize.
fn resize_step(old: &crate::Replica, new: &crate::Replica) -> bool {
    use crate::{Resize, ResizePhase::*};
    let same = old.processes == new.processes && old.resize == new.resize;
    same || match (old.resize, new.resize) {
        // Start.
        (None, Some(Resize { from, phase: Copy })) => from == old.processes,
        // Serve.
        (Some(a @ Resize { phase: Copy, .. }), Some(b @ Resize { phase: Serve, .. })) => {
            a.from == b.from && old.processes == new.processes
        }
        // Finish, or abandon before serving.
        (Some(Resize { phase: Serve, .. }), None) => new.processes == old.processes,
        (Some(Resize { from, phase: Copy }), None) => new.processes == from,
        _ => false,
    }
}
