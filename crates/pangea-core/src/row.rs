//! Replicated row state and the merge rule.
//!
//! A [`RowState`] is a state-based CRDT: it is a function of the *set* of row
//! mutations applied to it, whatever their order and however often each arrives
//! (docs/invariants.md, I4). That is what lets replicas receive writes along any path
//! and still hold byte-identical rows.
//!
//! The rule:
//! - every write has a [`Version`] (HLC timestamp, origin replica); versions are
//!   totally ordered, so last writer wins per cell;
//! - a delete at version `V` removes every matching cell version `< V` (strictly: a
//!   delete never removes what its own row mutation sets) and stays as a tombstone,
//!   so that matching writes arriving later, older than `V`, are dropped too;
//! - tombstones are kept as a set of *maximal* elements: one dominated by another
//!   (older and covering less) is dropped, and the set of maximal elements does not
//!   depend on arrival order;
//! - `max_versions = N` keeps the N newest versions *ever written* to a column
//!   (deleted ones stay as value-less "ghosts" within the N, so deleting the newest
//!   cannot bring back one already beyond N); the top N of a set is order-free;
//! - a TTL hides versions older than `now - ttl` and [`RowState::compact`] drops them.
//!
//! [`RowState::compact`] also purges tombstones at or below the purge horizon. Its
//! premise (I5): every write this replica has not yet applied is newer than the
//! horizon. Under it, purging never changes what a reader sees, now or after later
//! writes, so two replicas that purged at different moments still show the same
//! rows; [`RowState::visible_digest`] is computed over that visible content.

use crate::Error;
use crate::hlc::Timestamp;
use crate::ids::ReplicaId;
use crate::mutation::{Mutation, TimeRange};
use bytes::Bytes;
use pangea_proto::v1 as pb;
use pangea_topology::schema::{GcPolicy, TableSchema, validate_name};
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The identity and order of one write: last writer wins by (timestamp, origin).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub timestamp: Timestamp,
    pub origin: ReplicaId,
}

impl Version {
    pub fn new(timestamp: Timestamp, origin: ReplicaId) -> Self {
        Version { timestamp, origin }
    }

    fn to_proto(&self) -> pb::Version {
        pb::Version {
            timestamp: self.timestamp.as_u64(),
            origin: self.origin.to_string(),
        }
    }

    fn from_proto(p: Option<pb::Version>) -> Result<Self, Error> {
        let p = p.ok_or_else(|| Error::malformed("Version", "missing"))?;
        validate_name("replica", &p.origin)?;
        Ok(Version {
            timestamp: Timestamp::from_u64(p.timestamp),
            origin: p.origin.as_str().into(),
        })
    }
}

/// Which part of a row a read returns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReadFilter {
    /// Empty: every family.
    pub families: Vec<Arc<str>>,
    /// Empty: every column of the selected families. Otherwise only these.
    pub columns: Vec<(Arc<str>, Bytes)>,
    /// Versions per column, newest first; 0 means 1.
    pub versions_per_column: u32,
}

impl ReadFilter {
    /// Every version of every cell (for digests and tools).
    pub fn everything() -> Self {
        ReadFilter {
            versions_per_column: u32::MAX,
            ..Default::default()
        }
    }

    /// The newest version of every cell: what a point read asks for unless it
    /// narrows the families or columns or wants history.
    pub fn is_latest(&self) -> bool {
        self.families.is_empty() && self.columns.is_empty() && self.versions_per_column <= 1
    }

    fn wants_family(&self, family: &str) -> bool {
        (self.families.is_empty() && self.columns.is_empty())
            || self.families.iter().any(|f| &**f == family)
            || self.columns.iter().any(|(f, _)| &**f == family)
    }

    fn wants_column(&self, family: &str, column: &[u8]) -> bool {
        self.columns.is_empty()
            && (self.families.is_empty() || self.families.iter().any(|f| &**f == family))
            || self
                .columns
                .iter()
                .any(|(f, c)| &**f == family && c == column)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct RangeTombstone {
    range: TimeRange,
    version: Version,
}

impl RangeTombstone {
    fn dominates(&self, other: &RangeTombstone) -> bool {
        self.version >= other.version && self.range.covers(&other.range)
    }
}

#[derive(Debug, Clone, Eq, Default)]
struct ColumnState {
    /// Maximal range tombstones, sorted.
    range_tombstones: Vec<RangeTombstone>,
    /// Newest first; `None` is a ghost (deleted, kept only when the family has
    /// `max_versions`, to count against it).
    versions: Vec<(Version, Option<Bytes>)>,
}

/// Equal contents; values held in one buffer (copies of one write, as replicas
/// of one process hold them) are equal without comparing their bytes.
impl PartialEq for ColumnState {
    fn eq(&self, other: &Self) -> bool {
        let same = |a: &Option<Bytes>, b: &Option<Bytes>| match (a, b) {
            (Some(a), Some(b)) => (a.as_ptr() == b.as_ptr() && a.len() == b.len()) || a == b,
            (a, b) => a.is_none() && b.is_none(),
        };
        self.range_tombstones == other.range_tombstones
            && self.versions.len() == other.versions.len()
            && self
                .versions
                .iter()
                .zip(&other.versions)
                .all(|((v, a), (w, b))| v == w && same(a, b))
    }
}

impl ColumnState {
    fn is_empty(&self) -> bool {
        self.range_tombstones.is_empty() && self.versions.is_empty()
    }

    fn covers(&self, v: &Version) -> bool {
        self.range_tombstones
            .iter()
            .any(|rt| rt.range.contains(v.timestamp) && *v < rt.version)
    }

    fn insert(&mut self, version: &Version, value: Option<Bytes>, gc: &GcPolicy) {
        // Newest first: search with the order reversed.
        match self.versions.binary_search_by(|(v, _)| version.cmp(v)) {
            Ok(i) => {
                // The same write again, or (from a faulty peer) another value under the
                // same version: keep a deterministic winner, deleted beats present.
                let slot = &mut self.versions[i].1;
                *slot = match (slot.take(), value) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
            }
            Err(i) => self.versions.insert(i, (version.clone(), value)),
        }
        if let Some(n) = gc.max_versions {
            self.versions.truncate(n.max(1) as usize);
        }
    }

    /// Deletes the versions `matches` selects: ghosts under `max_versions`, else gone.
    fn delete_where(&mut self, gc: &GcPolicy, matches: impl Fn(&Version) -> bool) {
        if gc.max_versions.is_some() {
            for (v, value) in &mut self.versions {
                if matches(v) {
                    *value = None;
                }
            }
        } else {
            self.versions.retain(|(v, _)| !matches(v));
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct FamilyState {
    tombstone: Option<Version>,
    columns: BTreeMap<Bytes, ColumnState>,
}

impl FamilyState {
    fn is_empty(&self) -> bool {
        self.tombstone.is_none() && self.columns.is_empty()
    }

    fn delete_older_than(&mut self, gc: &GcPolicy, v: &Version) {
        for col in self.columns.values_mut() {
            col.range_tombstones.retain(|rt| rt.version > *v);
            col.delete_where(gc, |cell| cell < v);
        }
        self.columns.retain(|_, c| !c.is_empty());
    }
}

/// One row's replicated state: cell versions plus the tombstones that must outlive
/// them. See the module documentation for the merge rule.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RowState {
    tombstone: Option<Version>,
    families: BTreeMap<Arc<str>, FamilyState>,
    /// Kept up to date by every change ([`RowState::refresh_hint`]).
    hint: CompactHint,
}

/// What [`RowState::needs_compact`] and [`RowState::latest_value_bytes`] read
/// first: a summary of the row kept in the row itself, so that a sweep decides on
/// most rows, and a read sizes its answer, without following the row's families,
/// columns and versions through memory (three cache misses a row, the sweep's
/// whole cost). A function of the row's contents only, so equal rows have equal
/// hints (and `RowState`'s derived equality stays right).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct CompactHint {
    /// The oldest timestamp of any tombstone: row, family or range.
    oldest_tombstone: Option<Timestamp>,
    /// The oldest wall time (ms) of any column's oldest version.
    oldest_version_ms: Option<u64>,
    /// Some family or column is empty (compaction drops it).
    has_empty: bool,
    /// What [`RowState::latest_value_bytes`] returns while no version has expired:
    /// each column's name and newest value.
    newest_bytes: usize,
}

impl CompactHint {
    fn of(tombstone: &Option<Version>, families: &BTreeMap<Arc<str>, FamilyState>) -> Self {
        let mut h = CompactHint::default();
        let mut tomb = |v: &Version| {
            h.oldest_tombstone = Some(
                h.oldest_tombstone
                    .map_or(v.timestamp, |t| t.min(v.timestamp)),
            );
        };
        if let Some(t) = tombstone {
            tomb(t);
        }
        let mut has_empty = false;
        let mut oldest_ms: Option<u64> = None;
        let mut newest_bytes = 0;
        for fam in families.values() {
            has_empty |= fam.is_empty();
            if let Some(t) = &fam.tombstone {
                tomb(t);
            }
            for col in fam.columns.values() {
                has_empty |= col.is_empty();
                for rt in &col.range_tombstones {
                    tomb(&rt.version);
                }
                if let Some((v, _)) = col.versions.last() {
                    let ms = v.timestamp.wall_ms();
                    oldest_ms = Some(oldest_ms.map_or(ms, |o| o.min(ms)));
                }
            }
            newest_bytes += fam
                .columns
                .iter()
                .filter_map(|(column, col)| {
                    let value = col.versions.iter().find_map(|(_, value)| value.as_ref());
                    value.map(|value| column.len() + value.len())
                })
                .sum::<usize>();
        }
        h.has_empty = has_empty;
        h.oldest_version_ms = oldest_ms;
        h.newest_bytes = newest_bytes;
        h
    }
}

fn gc_of(table: Option<&TableSchema>, family: &str) -> GcPolicy {
    table
        .and_then(|t| t.family(family))
        .copied()
        .unwrap_or_default()
}

fn newer(t: &Option<Version>, v: &Version) -> bool {
    t.as_ref().is_some_and(|t| t >= v)
}

impl RowState {
    /// True when nothing is left: the store may delete the row.
    pub fn is_empty(&self) -> bool {
        self.tombstone.is_none() && self.families.is_empty()
    }

    /// Applies one row mutation's `mutations`, all at `version`. `table` supplies GC
    /// policies (an unknown family gets the default: keep every version).
    ///
    /// Within one row mutation, deletes apply to what came before it and never to the
    /// cells it sets; of two sets of the same cell, the later one counts.
    pub fn apply(
        &mut self,
        version: &Version,
        mutations: &[Mutation],
        table: Option<&TableSchema>,
    ) {
        // Sets and deletes at one version commute (deletes remove only older
        // versions), so sets go first (each cell's last set only), then deletes.
        let mut set_cells = std::collections::HashSet::new();
        for m in mutations.iter().rev() {
            if let Mutation::SetCell {
                family,
                column,
                value,
            } = m
                && set_cells.insert((family, column))
            {
                self.set_cell(version, family, column, value, &gc_of(table, family));
            }
        }
        for m in mutations {
            match m {
                Mutation::SetCell { .. } => {}
                Mutation::DeleteFromColumn {
                    family,
                    column,
                    range,
                } => {
                    self.delete_from_column(version, family, column, *range, &gc_of(table, family));
                }
                Mutation::DeleteFromFamily { family } => {
                    self.delete_from_family(version, family, &gc_of(table, family));
                }
                Mutation::DeleteFromRow => self.delete_from_row(version, table),
                Mutation::MergeRow(other) => self.merge(other, table),
            }
        }
        self.refresh_hint();
    }

    /// Recomputes the compaction hint: the last step of every public change.
    fn refresh_hint(&mut self) {
        self.hint = CompactHint::of(&self.tombstone, &self.families);
    }

    fn set_cell(
        &mut self,
        v: &Version,
        family: &Arc<str>,
        column: &Bytes,
        value: &Bytes,
        gc: &GcPolicy,
    ) {
        let row_tombstone = &self.tombstone;
        let fam = self.families.entry(family.clone()).or_default();
        let col = fam.columns.entry(column.clone()).or_default();
        let covered = row_tombstone.as_ref().is_some_and(|t| v < t)
            || fam.tombstone.as_ref().is_some_and(|t| v < t)
            || col.covers(v);
        if !covered {
            col.insert(v, Some(value.clone()), gc);
        } else if gc.max_versions.is_some() {
            col.insert(v, None, gc);
        }
        if col.is_empty() {
            fam.columns.remove(column);
            if fam.is_empty() {
                self.families.remove(family);
            }
        }
    }

    fn delete_from_column(
        &mut self,
        v: &Version,
        family: &Arc<str>,
        column: &Bytes,
        range: TimeRange,
        gc: &GcPolicy,
    ) {
        if newer(&self.tombstone, v) {
            return;
        }
        let fam = self.families.entry(family.clone()).or_default();
        if newer(&fam.tombstone, v) {
            return;
        }
        let col = fam.columns.entry(column.clone()).or_default();
        let new = RangeTombstone {
            range,
            version: v.clone(),
        };
        if col.range_tombstones.iter().any(|rt| rt.dominates(&new)) {
            return;
        }
        col.range_tombstones.retain(|rt| !new.dominates(rt));
        let at = col
            .range_tombstones
            .binary_search(&new)
            .unwrap_or_else(|i| i);
        col.range_tombstones.insert(at, new);
        col.delete_where(gc, |cell| range.contains(cell.timestamp) && cell < v);
    }

    fn delete_from_family(&mut self, v: &Version, family: &Arc<str>, gc: &GcPolicy) {
        if newer(&self.tombstone, v) {
            return;
        }
        let fam = self.families.entry(family.clone()).or_default();
        if newer(&fam.tombstone, v) {
            return;
        }
        fam.tombstone = Some(v.clone());
        fam.delete_older_than(gc, v);
    }

    fn delete_from_row(&mut self, v: &Version, table: Option<&TableSchema>) {
        if newer(&self.tombstone, v) {
            return;
        }
        self.tombstone = Some(v.clone());
        for (name, fam) in &mut self.families {
            if fam.tombstone.as_ref().is_some_and(|t| t <= v) {
                fam.tombstone = None;
            }
            fam.delete_older_than(&gc_of(table, name), v);
        }
        self.families.retain(|_, f| !f.is_empty());
    }

    /// Joins another replica's state of the same row into this one (snapshots).
    /// The result is what applying the union of both mutation sets gives: tombstones
    /// unite, each column keeps the top N versions of both, and a version deleted
    /// on either side is deleted.
    pub fn merge(&mut self, other: &RowState, table: Option<&TableSchema>) {
        if let Some(t) = &other.tombstone {
            self.delete_from_row(t, table);
        }
        for (name, fam) in &other.families {
            let gc = gc_of(table, name);
            if let Some(t) = &fam.tombstone {
                self.delete_from_family(t, name, &gc);
            }
            for (column, col) in &fam.columns {
                for rt in &col.range_tombstones {
                    self.delete_from_column(&rt.version, name, column, rt.range, &gc);
                }
                for (v, value) in &col.versions {
                    match value {
                        Some(value) => self.set_cell(v, name, column, value, &gc),
                        None => self.merge_ghost(v, name, column, &gc),
                    }
                }
            }
        }
        self.refresh_hint();
    }

    fn merge_ghost(&mut self, v: &Version, family: &Arc<str>, column: &Bytes, gc: &GcPolicy) {
        let fam = self.families.entry(family.clone()).or_default();
        let col = fam.columns.entry(column.clone()).or_default();
        if gc.max_versions.is_some() {
            col.insert(v, None, gc);
        } else {
            col.versions.retain(|(x, _)| x != v);
        }
        if col.is_empty() {
            fam.columns.remove(column);
            if fam.is_empty() {
                self.families.remove(family);
            }
        }
    }

    /// Garbage collection and tombstone purge.
    ///
    /// Drops versions past their family's TTL at `now_ms`, and tombstones whose
    /// version is at or below `horizon` together with the ghosts they made. Relies on
    /// premise I5: every write not yet applied here is newer than `horizon`.
    ///
    /// Returns whether the row changed, so that a sweep over many rows writes back
    /// only those (without keeping a copy of each to compare).
    pub fn compact(
        &mut self,
        table: Option<&TableSchema>,
        horizon: Timestamp,
        now_ms: u64,
    ) -> bool {
        let row_purged = self.tombstone.take_if(|t| t.timestamp <= horizon);
        let mut changed = row_purged.is_some();
        for (name, fam) in &mut self.families {
            let gc = gc_of(table, name);
            let fam_purged = fam.tombstone.take_if(|t| t.timestamp <= horizon);
            changed |= fam_purged.is_some();
            // Everything older than a purged row or family tombstone is already a
            // ghost; with the tombstone gone, no later write can be older than them.
            let purged = match (&row_purged, fam_purged) {
                (Some(r), Some(f)) => Some(r.clone().max(f)),
                (r, f) => f.or_else(|| r.clone()),
            };
            for col in fam.columns.values_mut() {
                let entries = col.range_tombstones.len() + col.versions.len();
                col.range_tombstones
                    .retain(|rt| rt.version.timestamp > horizon);
                if let Some(p) = &purged {
                    col.versions.retain(|(v, _)| v >= p);
                }
                if let Some(ttl) = gc.ttl_ms {
                    col.versions
                        .retain(|(v, _)| v.timestamp.wall_ms().saturating_add(ttl) > now_ms);
                }
                changed |= col.range_tombstones.len() + col.versions.len() != entries;
            }
            let columns = fam.columns.len();
            fam.columns.retain(|_, c| !c.is_empty());
            changed |= fam.columns.len() != columns;
        }
        let families = self.families.len();
        self.families.retain(|_, f| !f.is_empty());
        self.refresh_hint();
        changed | (self.families.len() != families)
    }

    /// True when no version of the row can have expired by `now_ms`, read from the
    /// hint alone: no column's oldest version is older than the hint's oldest, and
    /// no family keeps versions shorter than the table's shortest TTL (an unknown
    /// family keeps them for ever). False means one may have.
    fn none_expired(&self, table: Option<&TableSchema>, now_ms: u64) -> bool {
        let shortest_ttl = table.and_then(|t| t.families.values().filter_map(|f| f.ttl_ms).min());
        match (self.hint.oldest_version_ms, shortest_ttl) {
            (Some(oldest), Some(ttl)) => oldest.saturating_add(ttl) > now_ms,
            _ => true,
        }
    }

    /// Whether [`RowState::compact`] with these arguments would change the row,
    /// without changing it: a sweep over many rows copies only those that need it.
    /// Exact, not conservative (property-tested against `compact`).
    pub fn needs_compact(
        &self,
        table: Option<&TableSchema>,
        horizon: Timestamp,
        now_ms: u64,
    ) -> bool {
        // The hint first: it decides alone unless a version may have expired.
        let h = &self.hint;
        debug_assert_eq!(
            *h,
            CompactHint::of(&self.tombstone, &self.families),
            "stale hint"
        );
        if h.has_empty || h.oldest_tombstone.is_some_and(|t| t <= horizon) {
            return true;
        }
        if self.none_expired(table, now_ms) {
            return false;
        }
        // Any purged tombstone is a change; with none purged, nothing else is
        // dropped as older than one, so only expiry and empty parts remain.
        let purged = |t: &Option<Version>| t.as_ref().is_some_and(|t| t.timestamp <= horizon);
        if purged(&self.tombstone) {
            return true;
        }
        self.families.iter().any(|(name, fam)| {
            if fam.is_empty() || purged(&fam.tombstone) {
                return true;
            }
            let ttl = gc_of(table, name).ttl_ms;
            fam.columns.values().any(|col| {
                col.is_empty()
                    || col
                        .range_tombstones
                        .iter()
                        .any(|rt| rt.version.timestamp <= horizon)
                    // Newest first: the last version expires first.
                    || ttl.zip(col.versions.last()).is_some_and(|(ttl, (v, _))| {
                        v.timestamp.wall_ms().saturating_add(ttl) <= now_ms
                    })
            })
        })
    }

    /// What [`RowState::compact`] depends on besides the row and the table, when
    /// that is the horizon alone: the newest tombstone at or below `horizon`
    /// (`Some(None)`: none is). Compaction compares only tombstones with the
    /// horizon, so two horizons with the same cut compact a row alike; stores that
    /// share rows key shared compactions on it. `None` when a version may have
    /// expired under a TTL by `now_ms`, where the result depends on the clock too.
    pub fn purge_cut(
        &self,
        table: Option<&TableSchema>,
        horizon: Timestamp,
        now_ms: u64,
    ) -> Option<Option<Timestamp>> {
        if !self.none_expired(table, now_ms) {
            return None;
        }
        if self.hint.oldest_tombstone.is_none_or(|t| t > horizon) {
            return Some(None);
        }
        let mut cut: Option<Timestamp> = None;
        let mut see = |v: &Version| {
            if v.timestamp <= horizon {
                cut = cut.max(Some(v.timestamp));
            }
        };
        self.tombstone.iter().for_each(&mut see);
        for fam in self.families.values() {
            fam.tombstone.iter().for_each(&mut see);
            for col in fam.columns.values() {
                col.range_tombstones.iter().for_each(|rt| see(&rt.version));
            }
        }
        Some(cut)
    }

    /// What a reader sees at `now_ms` through `filter`: live (not deleted, not
    /// expired) versions, newest first. `None` when nothing is left to show.
    pub fn read(
        &self,
        key: &Bytes,
        filter: &ReadFilter,
        table: Option<&TableSchema>,
        now_ms: u64,
    ) -> Option<pb::Row> {
        self.read_until(key, filter, table, now_ms).0
    }

    /// [`RowState::read`] through [`ReadFilter::default`] (the newest version of
    /// every cell), encoded as a `pb::Row`, and the wall time (ms) before which that
    /// answer stays right: when its first cell expires (`u64::MAX` if none has a
    /// TTL). Until the row changes, every read before then gets the same bytes;
    /// cells expired at `now_ms` stay expired (time only moves forward), so only
    /// the returned cells' expiry matters.
    pub fn encode_latest(
        &self,
        key: &Bytes,
        table: Option<&TableSchema>,
        now_ms: u64,
    ) -> (Option<Bytes>, u64) {
        use pangea_proto::Message as _;
        let (row, until_ms) = self.read_until(key, &ReadFilter::default(), table, now_ms);
        (row.map(|r| Bytes::from(r.encode_to_vec())), until_ms)
    }

    /// [`RowState::read`], and until when (wall ms, exclusive) its answer holds.
    fn read_until(
        &self,
        key: &Bytes,
        filter: &ReadFilter,
        table: Option<&TableSchema>,
        now_ms: u64,
    ) -> (Option<pb::Row>, u64) {
        let mut until_ms = u64::MAX;
        let per_column = filter.versions_per_column.max(1) as usize;
        let mut families = Vec::new();
        for (name, fam) in self
            .families
            .iter()
            .filter(|(name, _)| filter.wants_family(name))
        {
            let ttl = gc_of(table, name).ttl_ms;
            let mut cells = Vec::new();
            for (column, col) in fam
                .columns
                .iter()
                .filter(|(c, _)| filter.wants_column(name, c))
            {
                let live = col
                    .versions
                    .iter()
                    .filter_map(|(v, value)| value.as_ref().map(|value| (v, value)))
                    .filter(|(v, _)| {
                        ttl.is_none_or(|ttl| v.timestamp.wall_ms().saturating_add(ttl) > now_ms)
                    })
                    .take(per_column)
                    .inspect(|(v, _)| {
                        if let Some(ttl) = ttl {
                            let expires = v.timestamp.wall_ms().saturating_add(ttl);
                            until_ms = until_ms.min(expires);
                        }
                    });
                cells.extend(live.map(|(v, value)| pb::Cell {
                    column: column.clone(),
                    timestamp: v.timestamp.as_u64(),
                    origin: v.origin.to_string(),
                    value: value.clone(),
                }));
            }
            if !cells.is_empty() {
                families.push(pb::FamilyCells {
                    name: name.to_string(),
                    cells,
                });
            }
        }
        let row = (!families.is_empty()).then(|| pb::Row {
            key: key.clone(),
            families,
        });
        (row, until_ms)
    }

    /// A 128-bit xxh3 digest of everything a reader can see in this row at `now_ms`
    /// (every version), including the key. Equal digests on two replicas mean equal
    /// visible rows (I4); see [`crate::digest`] for whole scopes.
    pub fn visible_digest(
        &self,
        key: &Bytes,
        table: Option<&TableSchema>,
        now_ms: u64,
    ) -> Option<u128> {
        use pangea_proto::Message;
        let row = self.read(key, &ReadFilter::everything(), table, now_ms)?;
        Some(xxhash_rust::xxh3::xxh3_128(&row.encode_to_vec()))
    }

    /// The canonical wire and store form: equal states encode to equal bytes.
    pub fn to_proto(&self, key: &Bytes) -> pb::RowState {
        pb::RowState {
            key: key.clone(),
            tombstone: self.tombstone.as_ref().map(Version::to_proto),
            families: self
                .families
                .iter()
                .map(|(name, fam)| pb::FamilyState {
                    name: name.to_string(),
                    tombstone: fam.tombstone.as_ref().map(Version::to_proto),
                    columns: fam
                        .columns
                        .iter()
                        .map(|(q, col)| pb::ColumnState {
                            qualifier: q.clone(),
                            range_tombstones: col
                                .range_tombstones
                                .iter()
                                .map(|rt| pb::RangeTombstone {
                                    time_range: Some(rt.range.to_proto()),
                                    version: Some(rt.version.to_proto()),
                                })
                                .collect(),
                            versions: col
                                .versions
                                .iter()
                                .map(|(v, value)| pb::VersionedValue {
                                    version: Some(v.to_proto()),
                                    value: value.clone(),
                                })
                                .collect(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// Parses a row state from a store or a peer. Checks names and structure and
    /// requires canonical order (sorted, no duplicates), so a damaged or hostile input
    /// is refused rather than silently reinterpreted.
    pub fn from_proto(p: pb::RowState) -> Result<(Bytes, RowState), Error> {
        let mut row = RowState {
            tombstone: p
                .tombstone
                .map(|v| Version::from_proto(Some(v)))
                .transpose()?,
            families: BTreeMap::new(),
            hint: CompactHint::default(),
        };
        let mut last_family: Option<Arc<str>> = None;
        for f in p.families {
            validate_name("family", &f.name)?;
            let name: Arc<str> = f.name.into();
            if last_family.as_ref().is_some_and(|l| *l >= name) {
                return Err(Error::malformed(
                    "RowState",
                    format!("family {name:?} out of order"),
                ));
            }
            let mut fam = FamilyState {
                tombstone: f
                    .tombstone
                    .map(|v| Version::from_proto(Some(v)))
                    .transpose()?,
                columns: BTreeMap::new(),
            };
            let mut last_column: Option<Bytes> = None;
            for c in f.columns {
                if last_column.as_ref().is_some_and(|l| *l >= c.qualifier) {
                    return Err(Error::malformed(
                        "RowState",
                        format!("column out of order in family {name:?}"),
                    ));
                }
                let mut col = ColumnState::default();
                for rt in c.range_tombstones {
                    let range = rt
                        .time_range
                        .ok_or_else(|| Error::malformed("RangeTombstone", "no time range"))?;
                    let rt = RangeTombstone {
                        range: TimeRange {
                            start: Timestamp::from_u64(range.start),
                            end: (range.end != 0).then_some(Timestamp::from_u64(range.end)),
                        },
                        version: Version::from_proto(rt.version)?,
                    };
                    if col.range_tombstones.last().is_some_and(|l| *l >= rt) {
                        return Err(Error::malformed(
                            "RowState",
                            "range tombstones out of order",
                        ));
                    }
                    col.range_tombstones.push(rt);
                }
                for vv in c.versions {
                    let v = Version::from_proto(vv.version)?;
                    if col
                        .versions
                        .last()
                        .is_some_and(|(l, _)| l.cmp(&v) != Ordering::Greater)
                    {
                        return Err(Error::malformed("RowState", "versions not newest-first"));
                    }
                    col.versions.push((v, vv.value));
                }
                last_column = Some(c.qualifier.clone());
                fam.columns.insert(c.qualifier, col);
            }
            last_family = Some(name.clone());
            row.families.insert(name, fam);
        }
        row.refresh_hint();
        Ok((p.key, row))
    }

    /// Every version the row carries: of cells, row and family tombstones and range
    /// tombstones (what a merge of this state would bring into another row).
    pub fn versions(&self) -> impl Iterator<Item = &Version> {
        self.tombstone
            .iter()
            .chain(self.families.values().flat_map(|f| {
                f.tombstone.iter().chain(f.columns.values().flat_map(|c| {
                    c.range_tombstones
                        .iter()
                        .map(|rt| &rt.version)
                        .chain(c.versions.iter().map(|(v, _)| v))
                }))
            }))
    }

    /// Names of the families this row holds anything of.
    pub fn family_names(&self) -> impl Iterator<Item = &str> {
        self.families.keys().map(|f| &**f)
    }

    /// Bytes of columns and values a read of the newest version of every cell
    /// returns at `now_ms` (what [`RowState::encode_latest`] carries, without the
    /// encoding's framing), counted without building the answer: read from the
    /// hint while no version can have expired.
    pub fn latest_value_bytes(&self, table: Option<&TableSchema>, now_ms: u64) -> usize {
        if self.none_expired(table, now_ms) {
            debug_assert_eq!(
                self.hint,
                CompactHint::of(&self.tombstone, &self.families),
                "stale hint"
            );
            return self.hint.newest_bytes;
        }
        self.families
            .iter()
            .map(|(name, fam)| {
                let ttl = gc_of(table, name).ttl_ms;
                let live = |v: &Version| {
                    ttl.is_none_or(|ttl| v.timestamp.wall_ms().saturating_add(ttl) > now_ms)
                };
                fam.columns
                    .iter()
                    .filter_map(|(column, col)| {
                        col.versions
                            .iter()
                            .find_map(|(v, value)| value.as_ref().filter(|_| live(v)))
                            .map(|value| column.len() + value.len())
                    })
                    .sum::<usize>()
            })
            .sum()
    }

    /// The row in parts of at most about `max_bytes` of columns and values each
    /// ([`RowState::value_bytes`]; a single version larger than that is a part of
    /// its own), whose [`RowState::merge`] in any order gives the row back: for
    /// snapshot chunks that must stay under a frame. Each part carries every
    /// tombstone of the row, its families, and the columns it holds (tombstones
    /// are idempotent under merge), and a share of the versions. A row within
    /// `max_bytes` is one part.
    pub fn split(&self, max_bytes: usize) -> Vec<RowState> {
        if self.value_bytes() <= max_bytes {
            return vec![self.clone()];
        }
        let skeleton = || RowState {
            tombstone: self.tombstone.clone(),
            families: self
                .families
                .iter()
                .filter(|(_, f)| f.tombstone.is_some())
                .map(|(name, f)| {
                    let fam = FamilyState {
                        tombstone: f.tombstone.clone(),
                        columns: BTreeMap::new(),
                    };
                    (name.clone(), fam)
                })
                .collect(),
            hint: CompactHint::default(),
        };
        let mut parts = Vec::new();
        let mut part = skeleton();
        let mut bytes = 0usize;
        for (name, fam) in &self.families {
            for (column, col) in &fam.columns {
                // Each version, with its column's name (counted again in each part
                // the column spans); a column of range tombstones only, by its name.
                let tombstones_only = col.versions.is_empty().then_some(None);
                for item in col.versions.iter().map(Some).chain(tombstones_only) {
                    let size = column.len()
                        + item.map_or(0, |(_, value)| value.as_ref().map_or(0, Bytes::len));
                    if bytes > 0 && bytes + size > max_bytes {
                        part.refresh_hint();
                        parts.push(std::mem::replace(&mut part, skeleton()));
                        bytes = 0;
                    }
                    let f = part.families.entry(name.clone()).or_default();
                    f.tombstone.clone_from(&fam.tombstone);
                    let c = f.columns.entry(column.clone()).or_default();
                    if c.range_tombstones.is_empty() {
                        c.range_tombstones.clone_from(&col.range_tombstones);
                    }
                    if let Some((v, value)) = item {
                        c.versions.push((v.clone(), value.clone()));
                    }
                    bytes += size;
                }
            }
        }
        part.refresh_hint();
        parts.push(part);
        parts
    }

    /// Bytes of keys and values held, for store statistics.
    pub fn value_bytes(&self) -> usize {
        self.families
            .values()
            .flat_map(|f| f.columns.iter())
            .map(|(q, c)| {
                q.len()
                    + c.versions
                        .iter()
                        .map(|(_, v)| v.as_ref().map_or(0, Bytes::len))
                        .sum::<usize>()
            })
            .sum()
    }
}
