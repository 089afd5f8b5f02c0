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

    /// Checks the entry against the deployment: an ordinary table the placement
    /// defines, policies it defines (and a migration target other than the current
    /// policy), a home region inside the policy. Every replica and client runs this
    /// on every entry, wherever it came from (a write, a peer, a snapshot, the
    /// store at start): an invalid entry is never put in force.
    pub fn check(&self, d: &Deployment) -> Result<(), InvalidEntry> {
        let invalid = |reason: String| InvalidEntry {
            table: self.table.to_string(),
            prefix: self.prefix.clone(),
            reason,
        };
        if self.table.starts_with('_') {
            return Err(invalid("system tables are always global".into()));
        }
        if d.placement.schema.table(&self.table).is_none() {
            return Err(invalid("the placement file defines no such table".into()));
        }
        let Some(policy) = d.placement.policy(&self.policy) else {
            return Err(invalid(format!(
                "unknown placement policy {:?}",
                self.policy.as_str()
            )));
        };
        if let Some(to) = &self.migrating_to {
            if d.placement.policy(to).is_none() {
                return Err(invalid(format!(
                    "unknown placement policy {:?} to migrate to",
                    to.as_str()
                )));
            }
            if to == &self.policy {
                return Err(invalid(format!(
                    "migrates to the policy it is in ({:?})",
                    to.as_str()
                )));
            }
        }
        if let Some(home) = &self.home
            && !policy.regions.contains(home)
        {
            return Err(invalid(format!(
                "home region {:?} is not a region of policy {:?}",
                home.as_str(),
                self.policy.as_str()
            )));
        }
        if self.job_id.is_empty() {
            return Err(invalid("no migration job wrote it (empty job id)".into()));
        }
        Ok(())
    }

    /// Whether this entry is the flip of a finished backfill: the migration job
    /// `job` (the `_jobs` row named by the entry) reached its flip moving exactly
    /// these rows to exactly this policy. Only such an entry may purge rows (I10):
    /// the job wrote it after every replica of the new policy durably held them.
    pub fn is_flip_of(&self, job: &pb::MigrationJob) -> bool {
        self.migrating_to.is_none()
            && !self.job_id.is_empty()
            && job.id == self.job_id
            && matches!(job.phase.as_str(), "flip" | "done")
            && job.table == *self.table
            && job.prefix == self.prefix
            && job.to_policy == self.policy.as_str()
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

/// A location entry that is not put in force, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "location entry for table {table:?} prefix {} refused: {reason}",
    crate::redact::RedactedKey(prefix)
)]
pub struct InvalidEntry {
    pub table: String,
    /// The entry's key prefix (user data: shown only hashed).
    pub prefix: Bytes,
    pub reason: String,
}

/// Checks a local write into `_location` before it enters a stream: one `SetCell`
/// of the entry column holding an entry valid under `d`. Deletes and merges of
/// location rows are refused too: only migration jobs write this table, and only
/// this way.
pub fn check_location_write(m: &crate::RowMutation, d: &Deployment) -> Result<(), Error> {
    use crate::Mutation;
    let invalid = |detail: String| Error::malformed("location write", detail);
    let [
        Mutation::SetCell {
            family,
            column,
            value,
        },
    ] = m.mutations()
    else {
        return Err(invalid(
            "a location row is written by one set of its entry cell".into(),
        ));
    };
    if &**family != LOCATION_FAMILY || column.as_ref() != LOCATION_COLUMN {
        return Err(invalid(format!(
            "a location entry lives in {LOCATION_FAMILY}:e, not {family}:{}",
            String::from_utf8_lossy(column)
        )));
    }
    let entry = LocationEntry::from_row(m.row_key(), value)?;
    entry.check(d).map_err(|e| invalid(e.to_string()))
}

/// The placement file's residency for the rows of `table` under `prefix`: the
/// policy of the prefix itself and of every longer prefix rule under it. A
/// location entry may narrow where those rows live, never widen it: see
/// [`escapes_residency`].
pub fn file_policies(file: &Deployment, table: &str, prefix: &[u8]) -> Vec<ScopeId> {
    let mut out = vec![file.scope_of(table, prefix).clone()];
    for r in &file.placement.rules {
        if *r.table == *table
            && r.prefix.len() > prefix.len()
            && r.prefix.as_bytes().starts_with(prefix)
            && !out.contains(&r.policy)
        {
            out.push(r.policy.clone());
        }
    }
    out
}

/// `Some(policy)`: putting the rows of `table` under `prefix` in policy `to` would
/// place some of them in a region the placement file's `policy` does not allow
/// (`file` is the deployment as the files declare it). Residency is widened by
/// editing the placement file, never by a location entry.
pub fn escapes_residency(
    file: &Deployment,
    table: &str,
    prefix: &[u8],
    to: &ScopeId,
) -> Option<ScopeId> {
    let to_regions = &file.placement.policy(to)?.regions;
    file_policies(file, table, prefix).into_iter().find(|f| {
        file.placement
            .policy(f)
            .is_none_or(|p| !to_regions.is_subset(&p.regions))
    })
}

/// The newest state of a migration job from its `_jobs` row (`None`: no job, or a
/// row that does not decode).
pub fn decode_job(key: &Bytes, row: &RowState) -> Option<pb::MigrationJob> {
    let read = row.read(key, &ReadFilter::default(), None, 0)?;
    let cell = read.families.into_iter().flat_map(|f| f.cells).next()?;
    pb::MigrationJob::decode(cell.value).ok()
}

/// What [`Location::apply_row`] did with one `_location` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocationChange {
    /// The row holds a valid entry, now in force.
    InForce(LocationEntry),
    /// The row holds no entry (deleted, or empty): the placement file governs.
    Removed,
    /// The row holds an entry that fails [`LocationEntry::check`] (or does not
    /// parse): not in force; the placement file governs its rows.
    Refused(InvalidEntry),
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

    pub fn len(&self) -> usize {
        self.entries.len()
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

    /// Updates from the state of one `_location` row (after a write or snapshot),
    /// checking the entry against the deployment: only a valid entry is put in
    /// force. The result is a function of the row and the deployment alone, so
    /// every replica, and the same replica after a restart, agrees.
    pub fn apply_row(
        &mut self,
        d: &Deployment,
        key: &Bytes,
        row: Option<&RowState>,
    ) -> LocationChange {
        let refused = |table: &str, prefix: Bytes, reason: String| {
            LocationChange::Refused(InvalidEntry {
                table: table.to_owned(),
                prefix,
                reason,
            })
        };
        let Some(nul) = key.iter().position(|&b| b == 0) else {
            return refused("", key.clone(), "key has no table separator".into());
        };
        let Ok(table) = std::str::from_utf8(&key[..nul]) else {
            return refused("", key.clone(), "table name is not UTF-8".into());
        };
        let table: Arc<str> = table.into();
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
        let Some(value) = value else {
            self.set(table, prefix, None);
            return LocationChange::Removed;
        };
        let checked = LocationEntry::from_row(key, &value)
            .map_err(|e| e.to_string())
            .and_then(|e| e.check(d).map(|()| e).map_err(|i| i.reason));
        match checked {
            Ok(e) => {
                self.set(table, prefix, Some(e.clone()));
                LocationChange::InForce(e)
            }
            Err(reason) => {
                self.set(table.clone(), prefix.clone(), None);
                refused(&table, prefix, reason)
            }
        }
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

    /// Whether the residency audit accepts a row of `table`/`key` in `replica`'s
    /// store. Its policy in force (a checked entry, else the rule of `d`, the
    /// deployment in force) or the one a migration moves it to must allow the
    /// replica — and, whatever entries say, so must the residency the placement
    /// file gives the row: `files` (the files as declared) or `d` (whose rules a
    /// reload may have pinned at the policy the rows had, until their migration
    /// ends). So a row an entry moved outside the file's regions is a violation.
    pub fn audit_allows(
        &self,
        files: &Deployment,
        d: &Deployment,
        replica: &pangea_topology::ReplicaId,
        table: &str,
        key: &[u8],
    ) -> bool {
        let in_force = d.allowed(replica, &self.scope_of(d, table, key))
            || self
                .migrating_to(table, key)
                .is_some_and(|m| d.allowed(replica, m));
        let resident = files.allowed(replica, files.scope_of(table, key))
            || d.allowed(replica, d.scope_of(table, key));
        in_force && resident
    }

    /// The policy a row is moving to, if a migration is under way.
    pub fn migrating_to(&self, table: &str, key: &[u8]) -> Option<&ScopeId> {
        self.lookup(table, key)
            .and_then(|e| e.migrating_to.as_ref())
    }
}
