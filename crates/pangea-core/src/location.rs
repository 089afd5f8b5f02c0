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
        let p = pb::LocationEntry::decode(value).map_err(|e| Error::decode("LocationEntry", e))?;
        Self::from_proto(key, p)
    }

    /// The entry of the `_location` row `key` from its message.
    pub fn from_proto(key: &[u8], p: pb::LocationEntry) -> Result<LocationEntry, Error> {
        let nul = key
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| Error::malformed("location key", "no table separator"))?;
        let table =
            std::str::from_utf8(&key[..nul]).map_err(|e| Error::decode("location key", e))?;
        pangea_topology::schema::validate_name("table", table)?;
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

/// Removed entries a [`Location`] remembers for readers that follow its changes
/// ([`Location::changes_since`]); past this, the oldest are forgotten and a reader
/// whose cursor is older reads everything again.
pub const TOMBSTONES_MAX: usize = 100_000;

/// Every location entry a replica (or client) knows, and — for readers that keep a
/// copy, such as clients and the serving path — the order they changed in.
///
/// Each change takes the next *version*; an entry (or the tombstone of a removed
/// one) is listed under the version of its last change only, so the change index
/// holds one slot per entry plus at most [`TOMBSTONES_MAX`] tombstones, however
/// often entries change. Versions count from the Location's *epoch*: a Location
/// rebuilt (a restart, a new deployment) takes another epoch, and a cursor of an
/// old one no longer applies.
#[derive(Debug, Clone, Default)]
pub struct Location {
    /// Per table, entries by prefix, with the version of their last change.
    tables: BTreeMap<Arc<str>, BTreeMap<Bytes, (LocationEntry, u64)>>,
    len: usize,
    /// Every entry, and every remembered tombstone, by the version of its last change.
    changes: BTreeMap<u64, (Arc<str>, Bytes)>,
    /// Removed entries still listed in `changes`, with that version.
    tombstones: BTreeMap<(Arc<str>, Bytes), u64>,
    tombstone_versions: std::collections::BTreeSet<u64>,
    version: u64,
    /// Changes at or below this version may be forgotten (tombstones dropped).
    floor: u64,
    epoch: u64,
    /// Tombstones kept (`None`: [`TOMBSTONES_MAX`]); smaller in tests.
    tombstones_max: Option<usize>,
    /// Names many entries share (policies, regions), held once.
    scopes: std::collections::BTreeSet<ScopeId>,
    regions: std::collections::BTreeSet<RegionId>,
}

/// Two Locations are equal when they hold the same entries (versions and epochs
/// aside).
impl PartialEq for Location {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.entries().eq(other.entries())
    }
}

impl Eq for Location {}

/// A cursor older than what a [`Location`] remembers: read everything again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forgotten;

impl Location {
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty Location whose versions count in `epoch` (see the type's docs).
    pub fn with_epoch(epoch: u64) -> Self {
        Location {
            epoch,
            ..Self::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The version of the last change (0: none).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Entries in (table, prefix) order.
    pub fn entries(&self) -> impl Iterator<Item = &LocationEntry> {
        self.tables
            .values()
            .flat_map(|t| t.values().map(|(e, _)| e))
    }

    /// Entries after `(table, prefix)` in (table, prefix) order (`None`: from the
    /// first): how a reader pages through a copy.
    pub fn entries_after<'a>(
        &'a self,
        after: Option<(&'a str, &'a [u8])>,
    ) -> impl Iterator<Item = &'a LocationEntry> + 'a {
        use std::ops::Bound::{Excluded, Unbounded};
        let (first, rest): (Option<&BTreeMap<Bytes, (LocationEntry, u64)>>, _) = match after {
            None => (None, self.tables.range::<str, _>((Unbounded, Unbounded))),
            Some((t, _)) => (
                self.tables.get(t),
                self.tables.range::<str, _>((Excluded(t), Unbounded)),
            ),
        };
        let prefix = after.map(|(_, p)| p).unwrap_or_default();
        let first = first
            .into_iter()
            .flat_map(move |m| m.range::<[u8], _>((Excluded(prefix), Unbounded)))
            .map(|(_, (e, _))| e);
        first.chain(rest.flat_map(|(_, m)| m.values().map(|(e, _)| e)))
    }

    /// What changed after version `since`, oldest first: each changed (table,
    /// prefix) once, with its entry now (`None`: removed), and the version of its
    /// last change. [`Forgotten`] when removals after `since` may have been
    /// forgotten: the reader must read everything again.
    #[allow(clippy::type_complexity)]
    pub fn changes_since(
        &self,
        since: u64,
    ) -> Result<impl Iterator<Item = (u64, &Arc<str>, &Bytes, Option<&LocationEntry>)>, Forgotten>
    {
        if since < self.floor {
            return Err(Forgotten);
        }
        Ok(self
            .changes
            .range(since + 1..)
            .map(|(v, (t, p))| (*v, t, p, self.get(t, p))))
    }

    /// The entry of exactly `(table, prefix)`.
    pub fn get(&self, table: &str, prefix: &[u8]) -> Option<&LocationEntry> {
        self.tables.get(table)?.get(prefix).map(|(e, _)| e)
    }

    /// Inserts (or, when `None`, removes) the entry of one `_location` row.
    pub fn set(&mut self, table: Arc<str>, prefix: Bytes, entry: Option<LocationEntry>) {
        if entry.is_none() && self.get(&table, &prefix).is_none() {
            return; // nothing to remove: no change
        }
        let version = self.version + 1;
        self.put(version, table, prefix, entry);
    }

    /// Brings this copy up to `source` (the same entries, versions and epoch):
    /// only what changed since this copy's version when they share an epoch and
    /// `source` still remembers it, else a whole copy. What the serving path does
    /// with the core's Location after every turn.
    pub fn follow(&mut self, source: &Location) {
        if self.epoch != source.epoch || self.version > source.version {
            *self = source.clone();
            return;
        }
        let Ok(changes) = source.changes_since(self.version) else {
            *self = source.clone();
            return;
        };
        for (v, t, p, e) in changes {
            self.put(v, t.clone(), p.clone(), e.cloned());
        }
        self.version = source.version;
        self.floor = self.floor.max(source.floor);
    }

    /// Records a change at `version` (above every earlier one).
    fn put(&mut self, version: u64, table: Arc<str>, prefix: Bytes, entry: Option<LocationEntry>) {
        debug_assert!(
            version > self.version,
            "changes are recorded in version order"
        );
        self.version = self.version.max(version);
        // The change replaces whatever slot this (table, prefix) had in the index.
        let old = match self.tables.get_mut(&table) {
            Some(m) => match &entry {
                Some(_) => m.get(&prefix).map(|(_, v)| *v),
                None => m.remove(&prefix).map(|(_, v)| {
                    self.len -= 1;
                    v
                }),
            },
            None => None,
        };
        if let Some(v) = old {
            self.changes.remove(&v);
        }
        if let Some(v) = self.tombstones.remove(&(table.clone(), prefix.clone())) {
            self.changes.remove(&v);
            self.tombstone_versions.remove(&v);
        }
        let table = match self.tables.get_key_value(&table) {
            Some((t, _)) => t.clone(),
            None => table,
        };
        self.changes
            .insert(version, (table.clone(), prefix.clone()));
        match entry {
            Some(mut e) => {
                e.table = table.clone();
                e.policy = shared(&mut self.scopes, e.policy);
                e.home = e.home.map(|h| shared(&mut self.regions, h));
                e.migrating_to = e.migrating_to.map(|m| shared(&mut self.scopes, m));
                let m = self.tables.entry(table).or_default();
                if m.insert(prefix, (e, version)).is_none() {
                    self.len += 1;
                }
            }
            None => {
                if self.tables.get(&table).is_some_and(BTreeMap::is_empty) {
                    self.tables.remove(&table);
                }
                self.tombstones.insert((table, prefix), version);
                self.tombstone_versions.insert(version);
                while self.tombstones.len() > self.tombstones_max.unwrap_or(TOMBSTONES_MAX) {
                    let Some(v) = self.tombstone_versions.pop_first() else {
                        break;
                    };
                    if let Some(key) = self.changes.remove(&v) {
                        self.tombstones.remove(&key);
                    }
                    self.floor = self.floor.max(v);
                }
            }
        }
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

    /// The entry governing a row: the longest prefix of `key` in `table`. A few
    /// ordered searches, not a walk: the greatest prefix at or below `key` either
    /// is a prefix of it or bounds where the next candidate can be.
    pub fn lookup(&self, table: &str, key: &[u8]) -> Option<&LocationEntry> {
        use std::ops::Bound::{Included, Unbounded};
        let m = self.tables.get(table)?;
        let mut upto = key;
        loop {
            let (p, (e, _)) = m
                .range::<[u8], _>((Unbounded, Included(upto)))
                .next_back()?;
            if key.starts_with(p) {
                return Some(e);
            }
            // Every prefix of `key` at or below `p` is a prefix of what the two share.
            let common = p.iter().zip(upto).take_while(|(a, b)| a == b).count();
            upto = &key[..common];
        }
    }

    /// The effective replication scope of a row: its policy (its location entry's,
    /// else the placement file's), for the row's shard group.
    pub fn scope_of(&self, d: &Deployment, table: &str, key: &[u8]) -> ScopeId {
        if table.starts_with('_') {
            return d.system_scope().clone();
        }
        match self.lookup(table, key) {
            Some(e) => d.group_scope(&e.policy, table, key).clone(),
            None => d.scope_of(table, key).clone(),
        }
    }

    /// The replication scope a migration moves a row to, if one is under way: the
    /// new policy's, for the row's shard group.
    pub fn migrating_scope<'a>(
        &'a self,
        d: &'a Deployment,
        table: &str,
        key: &[u8],
    ) -> Option<&'a ScopeId> {
        self.migrating_to(table, key)
            .map(|p| d.group_scope(p, table, key))
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
                .migrating_scope(d, table, key)
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

/// Most entries in one `LocationChangesResponse`.
pub const CHANGES_PAGE_MAX: usize = 1_000;

/// Where a reader of a replica's location metadata stands (the opaque cursor of
/// `LocationChangesRequest`): paging through every entry since `since` (after the
/// row key `after`), or following changes after version `since`, both in the
/// Location of `epoch`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cursor {
    Everything {
        epoch: u64,
        since: u64,
        after: Bytes,
    },
    Changes {
        epoch: u64,
        since: u64,
    },
}

impl Cursor {
    fn encode(&self) -> Bytes {
        let (tag, epoch, since, after) = match self {
            Cursor::Everything {
                epoch,
                since,
                after,
            } => (1u8, epoch, since, &after[..]),
            Cursor::Changes { epoch, since } => (2u8, epoch, since, &[][..]),
        };
        let mut b = BytesMut::with_capacity(17 + after.len());
        b.put_u8(tag);
        b.put_u64(*epoch);
        b.put_u64(*since);
        b.put_slice(after);
        b.freeze()
    }

    /// `None` for anything that is not a cursor (then the reader starts over).
    fn decode(b: &[u8]) -> Option<Cursor> {
        let (&tag, rest) = b.split_first()?;
        let epoch = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
        let since = u64::from_be_bytes(rest.get(8..16)?.try_into().ok()?);
        let after = &rest[16..];
        match tag {
            1 => Some(Cursor::Everything {
                epoch,
                since,
                after: Bytes::copy_from_slice(after),
            }),
            2 if after.is_empty() => Some(Cursor::Changes { epoch, since }),
            _ => None,
        }
    }
}

fn update(key: Bytes, entry: Option<&LocationEntry>) -> pb::LocationUpdate {
    pb::LocationUpdate {
        key,
        entry: entry.map(LocationEntry::to_proto),
    }
}

/// A replica's answer to `LocationChangesRequest { cursor, limit }` from its copy
/// `loc`: the changes after the cursor, or, when the cursor is not one of `loc`'s
/// epoch or is older than what `loc` remembers, every entry from the start (`reset`),
/// a page at a time, then the changes made while the reader paged.
pub fn changes_page(loc: &Location, cursor: &[u8], limit: u32) -> pb::LocationChangesResponse {
    let limit = match limit as usize {
        0 => CHANGES_PAGE_MAX,
        n => n.min(CHANGES_PAGE_MAX),
    };
    let epoch = loc.epoch();
    let (reset, since, after) = match Cursor::decode(cursor) {
        Some(Cursor::Changes { epoch: e, since }) if e == epoch => {
            if let Ok(changes) = loc.changes_since(since) {
                let mut updates = Vec::new();
                let mut last = since;
                let mut more = false;
                for (v, t, p, e) in changes {
                    if updates.len() == limit {
                        more = true;
                        break;
                    }
                    updates.push(update(location_key(t, p), e));
                    last = v;
                }
                let since = if more { last } else { loc.version() };
                return pb::LocationChangesResponse {
                    updates,
                    cursor: Cursor::Changes { epoch, since }.encode(),
                    reset: false,
                    more,
                };
            }
            (true, loc.version(), None)
        }
        Some(Cursor::Everything {
            epoch: e,
            since,
            after,
        }) if e == epoch => (false, since, Some(after)),
        _ => (true, loc.version(), None),
    };
    // Every entry, in key order, after `after`.
    let split = after.as_ref().and_then(|k| {
        let nul = k.iter().position(|&b| b == 0)?;
        Some((std::str::from_utf8(&k[..nul]).ok()?, &k[nul + 1..]))
    });
    let mut updates = Vec::new();
    let mut more = false;
    for e in loc.entries_after(split) {
        if updates.len() == limit {
            more = true;
            break;
        }
        updates.push(update(location_key(&e.table, &e.prefix), Some(e)));
    }
    let cursor = match updates.last() {
        Some(u) if more => Cursor::Everything {
            epoch,
            since,
            after: u.key.clone(),
        },
        // The last page: then what changed while the reader paged (nothing left
        // to ask for when nothing did).
        _ => {
            more = loc.version() != since;
            Cursor::Changes { epoch, since }
        }
    };
    pb::LocationChangesResponse {
        updates,
        cursor: cursor.encode(),
        reset,
        more,
    }
}

/// The set's equal name if it has one (held once), else `name`, now in the set.
fn shared<T: Ord + Clone>(set: &mut std::collections::BTreeSet<T>, name: T) -> T {
    match set.get(&name) {
        Some(n) => n.clone(),
        None => {
            set.insert(name.clone());
            name
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(table: &str, prefix: &[u8], policy: u8) -> LocationEntry {
        LocationEntry {
            table: table.into(),
            prefix: Bytes::copy_from_slice(prefix),
            policy: ScopeId::new(format!("p{policy}")),
            home: policy.is_multiple_of(2).then(|| RegionId::new("eu-west-1")),
            version: 1,
            migrating_to: None,
            job_id: "job".into(),
        }
    }

    /// Changes to a few tables and short prefixes over a tiny alphabet, so that
    /// prefixes nest and repeat.
    fn ops() -> impl Strategy<Value = Vec<(u8, Vec<u8>, Option<u8>)>> {
        prop::collection::vec(
            (
                0u8..2,
                prop::collection::vec(b'a'..b'd', 0..4),
                prop::option::weighted(0.7, 0u8..4),
            ),
            0..80,
        )
    }

    fn apply(l: &mut Location, (t, p, policy): &(u8, Vec<u8>, Option<u8>)) {
        let table = ["t0", "t1"][*t as usize];
        l.set(
            table.into(),
            Bytes::copy_from_slice(p),
            policy.map(|x| entry(table, p, x)),
        );
    }

    /// What a reader holds after following `source` with `changes_since`, reading
    /// everything again when told its cursor is forgotten.
    fn catch_up(
        copy: &mut BTreeMap<(String, Bytes), LocationEntry>,
        cursor: &mut u64,
        source: &Location,
    ) {
        match source.changes_since(*cursor) {
            Ok(changes) => {
                for (_, t, p, e) in changes {
                    match e {
                        Some(e) => copy.insert((t.to_string(), p.clone()), e.clone()),
                        None => copy.remove(&(t.to_string(), p.clone())),
                    };
                }
            }
            Err(Forgotten) => {
                *copy = source
                    .entries()
                    .map(|e| ((e.table.to_string(), e.prefix.clone()), e.clone()))
                    .collect();
            }
        }
        *cursor = source.version();
    }

    proptest! {
        /// The ordered lookup finds what a walk over every entry finds; a copy
        /// that follows, a reader that applies changes since its cursor, and a
        /// reader that pages with `entries_after`, all end with the same entries,
        /// whatever was forgotten.
        #[test]
        fn lookups_changes_and_copies_agree(
            batches in prop::collection::vec(ops(), 1..6),
            probes in prop::collection::vec((0u8..2, prop::collection::vec(b'a'..b'd', 0..6)), 1..20),
            tombstones_max in 1usize..8,
        ) {
            let mut source = Location::with_epoch(7);
            source.tombstones_max = Some(tombstones_max);
            let mut follower = Location::new();
            let mut reader = BTreeMap::new();
            let mut cursor = 0;
            for batch in &batches {
                for op in batch {
                    apply(&mut source, op);
                }
                follower.follow(&source);
                prop_assert_eq!(&follower, &source);
                prop_assert_eq!(follower.version(), source.version());
                catch_up(&mut reader, &mut cursor, &source);
                let want: Vec<&LocationEntry> = source.entries().collect();
                prop_assert_eq!(reader.values().collect::<Vec<_>>(), want.clone());
                // Paging two at a time.
                let mut paged: Vec<&LocationEntry> = Vec::new();
                loop {
                    let after = paged.last().map(|e| (&*e.table, &e.prefix[..]));
                    let page: Vec<&LocationEntry> = source.entries_after(after).take(2).collect();
                    if page.is_empty() {
                        break;
                    }
                    paged.extend(page);
                }
                prop_assert_eq!(paged, want);
                prop_assert!(source.tombstones.len() <= tombstones_max);
                prop_assert_eq!(source.changes.len(), source.len() + source.tombstones.len());
            }
            for (t, key) in &probes {
                let table = ["t0", "t1"][*t as usize];
                let walk = source
                    .entries()
                    .filter(|e| &*e.table == table && key.starts_with(&e.prefix))
                    .max_by_key(|e| e.prefix.len());
                prop_assert_eq!(source.lookup(table, key), walk);
            }
        }
    }

    /// A reader of `changes_page` as `pangea-client` is: a copy it routes with,
    /// and one it builds after a reset until the answer says nothing more follows.
    #[derive(Default)]
    struct Reader {
        live: BTreeMap<Bytes, pb::LocationEntry>,
        building: Option<BTreeMap<Bytes, pb::LocationEntry>>,
        cursor: Bytes,
        resets: usize,
    }

    impl Reader {
        /// One request; whether more follows.
        fn ask(&mut self, source: &Location, limit: u32) -> bool {
            let r = changes_page(source, &self.cursor, limit);
            if r.reset {
                self.building = Some(BTreeMap::new());
                self.resets += 1;
            }
            let copy = self.building.as_mut().unwrap_or(&mut self.live);
            for u in r.updates {
                match u.entry {
                    Some(e) => copy.insert(u.key, e),
                    None => copy.remove(&u.key),
                };
            }
            self.cursor = r.cursor;
            if !r.more
                && let Some(b) = self.building.take()
            {
                self.live = b;
            }
            r.more
        }
    }

    fn as_rows(l: &Location) -> BTreeMap<Bytes, pb::LocationEntry> {
        l.entries()
            .map(|e| (location_key(&e.table, &e.prefix), e.to_proto()))
            .collect()
    }

    proptest! {
        /// However changes and pages interleave, whatever the page size and however
        /// many removals are forgotten, a reader that asks until nothing more
        /// follows holds exactly the source's entries.
        #[test]
        fn a_reader_of_pages_ends_with_the_source(
            steps in prop::collection::vec((ops(), 1u32..4, 0usize..4), 1..8),
            tombstones_max in 1usize..6,
        ) {
            let mut source = Location::with_epoch(3);
            source.tombstones_max = Some(tombstones_max);
            let mut reader = Reader::default();
            for (batch, limit, asks) in &steps {
                for op in batch {
                    apply(&mut source, op);
                }
                for _ in 0..*asks {
                    reader.ask(&source, *limit);
                }
            }
            let mut rounds = 0;
            while reader.ask(&source, 2) {
                rounds += 1;
                prop_assert!(rounds < 1_000, "never done");
            }
            prop_assert_eq!(&reader.live, &as_rows(&source));
            // Up to date: the next answer is empty and needs no reset.
            let r = changes_page(&source, &reader.cursor, 2);
            prop_assert!(r.updates.is_empty() && !r.reset && !r.more);
        }
    }

    #[test]
    fn a_foreign_or_garbage_cursor_starts_over() {
        let mut a = Location::with_epoch(1);
        for p in [b"a", b"b", b"c"] {
            a.set("t".into(), Bytes::from_static(p), Some(entry("t", p, 0)));
        }
        let mut reader = Reader::default();
        while reader.ask(&a, 2) {}
        assert_eq!(reader.resets, 1);
        assert_eq!(reader.live, as_rows(&a));
        // The same entries in another replica's Location (another epoch).
        let mut b = Location::with_epoch(2);
        for e in a.entries() {
            b.set(e.table.clone(), e.prefix.clone(), Some(e.clone()));
        }
        b.set("t".into(), Bytes::from_static(b"b"), None);
        while reader.ask(&b, 2) {}
        assert_eq!(reader.resets, 2);
        assert_eq!(reader.live, as_rows(&b));
        for garbage in [&b""[..], b"\x02short", b"\x09123456781234567800"] {
            let r = changes_page(&b, garbage, 10);
            assert!(r.reset, "{garbage:?}");
            assert_eq!(r.updates.len(), 2);
        }
    }

    #[test]
    fn a_cursor_from_another_epoch_or_before_the_floor_reads_everything() {
        let mut l = Location::with_epoch(1);
        l.tombstones_max = Some(1);
        for p in [b"a", b"b", b"c"] {
            l.set("t".into(), Bytes::from_static(p), Some(entry("t", p, 0)));
        }
        assert_eq!(l.version(), 3);
        assert_eq!(l.changes_since(0).map(|c| c.count()), Ok(3));
        l.set("t".into(), Bytes::from_static(b"a"), None);
        l.set("t".into(), Bytes::from_static(b"b"), None);
        // The first tombstone is forgotten: a reader from before it must start over.
        assert_eq!(l.changes_since(3).map(|c| c.count()), Err(Forgotten));
        assert_eq!(l.changes_since(4).map(|c| c.count()), Ok(1));
        // Removing what is not there changes nothing.
        l.set("t".into(), Bytes::from_static(b"zz"), None);
        assert_eq!(l.version(), 5);
    }
}
