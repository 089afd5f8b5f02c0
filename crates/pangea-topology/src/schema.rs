//! Table schemas: which tables exist, their column families, and how each family
//! garbage-collects old versions.
//!
//! Names are restricted so they can be used verbatim in storage keys, metric labels
//! and file names: 1 to [`NAME_BYTES_MAX`] bytes of ASCII letters, digits, `_`, `-`
//! and `.`. In particular they never contain the NUL byte the store uses as separator.

use std::collections::BTreeMap;
use std::sync::Arc;

/// Longest table, family, scope or replica name, in bytes.
pub const NAME_BYTES_MAX: usize = 128;

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{kind} name is empty")]
    Empty { kind: &'static str },
    #[error("{kind} name is {size} bytes, limit {limit}")]
    TooLong {
        kind: &'static str,
        size: usize,
        limit: usize,
    },
    #[error("{kind} name {name:?} contains {ch:?}; allowed: ASCII letters, digits, '_', '-', '.'")]
    BadChar {
        kind: &'static str,
        name: String,
        ch: char,
    },
    /// "." and "..": names become directory and file names (a replica's data
    /// directory, certificate files), where these would escape.
    #[error("{kind} name {name:?} consists only of dots, which is not path-safe")]
    DotsOnly { kind: &'static str, name: String },
    #[error(
        "scope name {name:?}: the shard group after '/' must be a number below {limit} without leading zeros"
    )]
    BadGroup { name: String, limit: u32 },
}

/// Checks a replication scope's name: a policy name, alone or followed by `/` and
/// a shard group below [`crate::shard::SHARD_GROUPS_MAX`] ([`crate::ScopeId`]).
pub fn validate_scope(name: &str) -> Result<(), NameError> {
    let scope = crate::ScopeId::new(name);
    validate_name("scope", scope.policy())?;
    if scope.policy().len() < name.len()
        && scope
            .group()
            .is_none_or(|g| g.0 >= crate::shard::SHARD_GROUPS_MAX)
    {
        return Err(NameError::BadGroup {
            name: name.to_owned(),
            limit: crate::shard::SHARD_GROUPS_MAX,
        });
    }
    Ok(())
}

/// Checks a table, family, scope or replica name; `kind` says which, for the error.
pub fn validate_name(kind: &'static str, name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty { kind });
    }
    if name.len() > NAME_BYTES_MAX {
        return Err(NameError::TooLong {
            kind,
            size: name.len(),
            limit: NAME_BYTES_MAX,
        });
    }
    if let Some(ch) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_-.".contains(*c)))
    {
        return Err(NameError::BadChar {
            kind,
            name: name.to_owned(),
            ch,
        });
    }
    if name.bytes().all(|b| b == b'.') {
        return Err(NameError::DotsOnly {
            kind,
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// A column family's kind and how it forgets old data. Both limits may apply at
/// once (a counter family takes no `max_versions`).
///
/// `max_versions` keeps the newest N versions *ever written* to a column, deleted ones
/// included: deleting the newest version does not bring back one that was already
/// beyond N. This is what makes garbage collection deterministic across replicas
/// (see `pangea-core`'s `row` module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GcPolicy {
    /// Keep at most this many versions per column; `None` keeps all.
    pub max_versions: Option<u32>,
    /// Versions older than this (by their timestamp) are invisible and purged; `None`
    /// keeps them forever. In a counter family, increments expire by the minute
    /// (`pangea-core`'s `row` module, counters).
    pub ttl_ms: Option<u64>,
    pub kind: FamilyKind,
}

/// What a family's cells are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FamilyKind {
    /// Values written by `SetCell`; last writer wins per cell.
    #[default]
    Cells,
    /// 64-bit signed counters changed by `Increment`: a cell's value is the sum of
    /// every increment ever applied to it (and not deleted or expired), so
    /// concurrent increments in every region all count.
    Counter,
}

impl GcPolicy {
    pub fn is_counter(&self) -> bool {
        self.kind == FamilyKind::Counter
    }
}

/// One table: its families and their GC policies, and which prefix of its row
/// keys picks a row's shard group.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TableSchema {
    pub families: BTreeMap<Arc<str>, GcPolicy>,
    /// `None`: the whole row key ([`crate::shard`]).
    pub partition_key: Option<crate::shard::PartitionKey>,
    /// `None`: writes take the replica's clock only; `Some`: a write may carry
    /// its own event time within this window.
    pub event_time: Option<EventTimeWindow>,
    /// `Some`: the table has a change stream, and replicas keep its changes
    /// in their replication log this long (ms) after they were written.
    pub change_retention_ms: Option<u64>,
}

/// How far from the accepting replica's clock a write's event time may lie
/// (`pangea-core`'s `row` module, event time). `past_ms` also delays the purge
/// of the table's tombstones by as much: a write may arrive at any time
/// stamped that far back, and a tombstone must still be there to delete it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTimeWindow {
    pub past_ms: u64,
    pub future_ms: u64,
}

impl EventTimeWindow {
    /// Longest `future`: a write stamped ahead wins over every real-time write
    /// to its cells until the clock gets there.
    pub const FUTURE_MAX_MS: u64 = 3_600_000;
    /// Longest `past`: ten years.
    pub const PAST_MAX_MS: u64 = 3_650 * 86_400_000;
    /// `future` when the file does not say.
    pub const FUTURE_DEFAULT_MS: u64 = 60_000;
}

impl TableSchema {
    /// The GC policy of `family`, or `None` if the table has no such family.
    pub fn family(&self, family: &str) -> Option<&GcPolicy> {
        self.families.get(family)
    }

    /// True when some family of the table is a counter family.
    pub fn has_counters(&self) -> bool {
        self.families.values().any(GcPolicy::is_counter)
    }
}

/// Every table of a deployment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Schema {
    pub tables: BTreeMap<Arc<str>, TableSchema>,
}

impl Schema {
    pub fn table(&self, table: &str) -> Option<&TableSchema> {
        self.tables.get(table)
    }

    /// The longest change-stream retention of any table (ms), if any table
    /// has a change stream: how long replicas keep every replication log
    /// entry (a scope's log holds every table's writes).
    pub fn change_retention_ms(&self) -> Option<u64> {
        self.tables
            .values()
            .filter_map(|t| t.change_retention_ms)
            .max()
    }

    /// The tables applications use: all but the system tables (`_location`,
    /// `_jobs`), in name order.
    pub fn user_tables(&self) -> impl Iterator<Item = &Arc<str>> {
        self.tables.keys().filter(|t| !t.starts_with('_'))
    }

    /// A schema with one table, for tests and examples.
    pub fn single_table(table: &str, families: &[(&str, GcPolicy)]) -> Self {
        let families = families
            .iter()
            .map(|(name, gc)| (Arc::from(*name), *gc))
            .collect();
        let schema = TableSchema {
            families,
            partition_key: None,
            event_time: None,
            change_retention_ms: None,
        };
        Schema {
            tables: BTreeMap::from([(Arc::from(table), schema)]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(validate_name("table", "ad_profiles-v1.2").is_ok());
        assert_eq!(
            validate_name("table", ""),
            Err(NameError::Empty { kind: "table" })
        );
        assert!(matches!(
            validate_name("family", "a\0b"),
            Err(NameError::BadChar { ch: '\0', .. })
        ));
        let long = "x".repeat(NAME_BYTES_MAX + 1);
        assert_eq!(
            validate_name("table", &long),
            Err(NameError::TooLong {
                kind: "table",
                size: 129,
                limit: 128
            })
        );
    }
}
