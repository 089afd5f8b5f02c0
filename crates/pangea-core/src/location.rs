//! Location metadata: the `_location` system table, replicated in the global scope,
//! which overrides the placement file's prefix rules row by row — how placement
//! changes at run time, and how rows migrate between policies with no downtime.
//!
//! A row's effective policy is the entry with the longest prefix of its key in its
//! table, if any, else the placement file's rule (docs/placement.md). During a
//! migration an entry names both the policy rows are in and the one they move to;
//! writes then go to both.

use crate::Error;
use crate::row::{ReadFilter, RowState};
use bytes::{BufMut, Bytes, BytesMut};
use pangea_proto::Message;
use pangea_proto::v1 as pb;
use pangea_topology::{Deployment, RegionId, ScopeId};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The system table holding location entries.
pub const LOCATION_TABLE: &str = "_location";
/// Its one family and column.
pub const LOCATION_FAMILY: &str = "l";
pub const LOCATION_COLUMN: &[u8] = b"e";
/// The system table holding migration jobs.
pub const JOBS_TABLE: &str = "_jobs";
pub const JOBS_FAMILY: &str = "j";
pub const JOBS_COLUMN: &[u8] = b"s";

/// One location entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocationEntry {
    pub table: Arc<str>,
    pub prefix: Bytes,
    pub policy: ScopeId,
    pub home: Option<RegionId>,
    pub version: u64,
    /// Set while a migration moves the rows to another policy.
    pub migrating_to: Option<ScopeId>,
    pub job_id: String,
}

/// The `_location` row key of (table, prefix).
pub fn location_key(table: &str, prefix: &[u8]) -> Bytes {
    let mut k = BytesMut::with_capacity(table.len() + 1 + prefix.len());
    k.put_slice(table.as_bytes());
    k.put_u8(0);
    k.put_slice(prefix);
    k.freeze()
}

impl LocationEntry {
    pub fn to_proto(&self) -> pb::LocationEntry {
        pb::LocationEntry {
            policy: self.policy.to_string(),
            home_region: self
                .home
                .as_ref()
                .map(|h| h.to_string())
                .unwrap_or_default(),
            version: self.version,
            migrating_to: self
                .migrating_to
                .as_ref()
                .map(|m| m.to_string())
                .unwrap_or_default(),
            job_id: self.job_id.clone(),
        }
    }

    /// Parses the newest value of a `_location` row.
    pub fn from_row(key: &[u8], value: &[u8]) -> Result<LocationEntry, Error> {
        let nul = key
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| Error::malformed("location key", "no table separator"))?;
        let table =
            std::str::from_utf8(&key[..nul]).map_err(|e| Error::decode("location key", e))?;
        pangea_topology::schema::validate_name("table", table)?;
        let p = pb::LocationEntry::decode(value).map_err(|e| Error::decode("LocationEntry", e))?;
        pangea_topology::schema::validate_name("policy", &p.policy)?;
        Ok(LocationEntry {
            table: table.into(),
            prefix: Bytes::copy_from_slice(&key[nul + 1..]),
            policy: p.policy.as_str().into(),
            home: (!p.home_region.is_empty()).then(|| p.home_region.as_str().into()),
            version: p.version,
            migrating_to: (!p.migrating_to.is_empty()).then(|| p.migrating_to.as_str().into()),
            job_id: p.job_id,
        })
    }
}

/// Every location entry a replica (or client) knows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Location {
    entries: BTreeMap<(Arc<str>, Bytes), LocationEntry>,
}

impl Location {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> impl Iterator<Item = &LocationEntry> {
        self.entries.values()
    }

    /// Inserts (or, when `None`, removes) the entry of one `_location` row.
    pub fn set(&mut self, table: Arc<str>, prefix: Bytes, entry: Option<LocationEntry>) {
        match entry {
            Some(e) => self.entries.insert((table, prefix), e),
            None => self.entries.remove(&(table, prefix)),
        };
    }

    /// Updates from the state of one `_location` row (after a write or snapshot).
    /// Returns the entry now in force for that row's (table, prefix).
    pub fn apply_row(&mut self, key: &Bytes, row: Option<&RowState>) -> Option<LocationEntry> {
        let nul = key.iter().position(|&b| b == 0)?;
        let table: Arc<str> = std::str::from_utf8(&key[..nul]).ok()?.into();
        let prefix = key.slice(nul + 1..);
        let value = row
            .and_then(|r| r.read(key, &ReadFilter::default(), None, 0))
            .and_then(|r| {
                r.families
                    .into_iter()
                    .flat_map(|f| f.cells)
                    .find(|c| c.column.as_ref() == LOCATION_COLUMN)
                    .map(|c| c.value)
            });
        let entry = value.and_then(|v| LocationEntry::from_row(key, &v).ok());
        self.set(table, prefix, entry.clone());
        entry
    }

    /// The entry governing a row: the longest prefix of `key` in `table`.
    pub fn lookup(&self, table: &str, key: &[u8]) -> Option<&LocationEntry> {
        self.entries
            .iter()
            .filter(|((t, p), _)| &**t == table && key.starts_with(p))
            .max_by_key(|((_, p), _)| p.len())
            .map(|(_, e)| e)
    }

    /// The effective policy (scope) of a row.
    pub fn scope_of(&self, d: &Deployment, table: &str, key: &[u8]) -> ScopeId {
        if table.starts_with('_') {
            return ScopeId::global();
        }
        match self.lookup(table, key) {
            Some(e) => e.policy.clone(),
            None => d.scope_of(table, key).clone(),
        }
    }

    /// The effective home region of a row.
    pub fn home_of(&self, d: &Deployment, table: &str, key: &[u8]) -> Option<RegionId> {
        match self.lookup(table, key) {
            Some(e) => e.home.clone(),
            None => d.placement.home_of(table, key).cloned(),
        }
    }

    /// The policy a row is moving to, if a migration is under way.
    pub fn migrating_to(&self, table: &str, key: &[u8]) -> Option<&ScopeId> {
        self.lookup(table, key)
            .and_then(|e| e.migrating_to.as_ref())
    }
}
