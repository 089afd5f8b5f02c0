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
//! Counters (a family of `type = "counter"`): each `Increment` is kept as a
//! version of its cell whose value is the delta, so a cell is the *set* of its
//! increments and its value their sum. Merging sets is order-free and
//! idempotent, as for every other write, and deletes remove the increments older
//! than them as they remove versions. [`RowState::compact`] folds the increments
//! at or below the purge horizon into one [`Folded`] sum per origin (and per
//! expiry bucket), which stands for exactly those increments: by I5 every one of
//! them has arrived, so the fold is the same on every replica that makes it, and
//! a merge keeps, per origin and bucket, the fold that reaches furthest and drops
//! the increments it already counts. Under a TTL, an increment counts until the
//! end of its wall-clock minute ([`COUNTER_BUCKET_MS`]) plus the TTL, so a fold
//! per minute expires exactly when its increments would. A counter's size thus
//! grows with the increments of the last few seconds (and one fold per origin, or
//! per origin and minute within the TTL), not with every increment ever made.
//!
//! [`RowState::compact`] also purges tombstones at or below the purge horizon. Its
//! premise (I5): every write this replica has not yet applied is newer than the
//! horizon. Under it, purging never changes what a reader sees, now or after later
//! writes, so two replicas that purged at different moments still show the same
//! rows; [`RowState::visible_digest`] is computed over that visible content.
//!
//! Event time: on a table with an `event_time` window, a row mutation may carry
//! its own timestamp ([`crate::RowMutation::at_event_time`]); its sets and
//! deletes take the version (event time, origin) on every replica
//! ([`crate::RowMutation::cell_version`]), so the rule above is unchanged, while
//! the write is logged and acknowledged at the clock's time. An event time is at
//! most the window's `past` before the log time, so a write not yet applied has
//! cells newer than the replica's horizon minus `past`: rows of such a table are
//! compacted at that horizon ([`table_horizon`]), which keeps I5 true of the
//! versions rows hold. Equal versions (one origin, one event millisecond) keep the
//! bytewise greater value, in any order.

use crate::Error;
use crate::filter::CellFilter;
use crate::hlc::Timestamp;
use crate::ids::ReplicaId;
use crate::mutation::{Mutation, TimeRange};
use bytes::Bytes;
use pangea_proto::v1 as pb;
use pangea_topology::schema::FamilyKind;
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
    /// Versions per column, newest first; 0 means 1. With `cells`, the newest of
    /// those the filter kept.
    pub versions_per_column: u32,
    /// A server-side filter tree every live version of the selected columns goes
    /// through ([`crate::filter`]); `None`: none.
    pub cells: Option<CellFilter>,
}

impl ReadFilter {
    /// The same read as of wall time `ms`: each column's newest versions stamped
    /// at or before `ms`, then this filter's tree on those.
    pub fn as_of(mut self, ms: u64) -> Self {
        let cut = CellFilter::TimestampRange {
            start_ms: 0,
            end_ms: Some(ms.saturating_add(1)),
        };
        self.cells = Some(match self.cells.take() {
            None => cut,
            Some(tree) => CellFilter::Chain(vec![cut, tree]),
        });
        self
    }

    /// The filter a read with `consistency` runs: this one, cut at the time of
    /// a read as of a time.
    pub fn under(self, consistency: &crate::read::Consistency) -> Self {
        match consistency {
            crate::read::Consistency::AsOf { ms } => self.as_of(*ms),
            _ => self,
        }
    }

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
        self.families.is_empty()
            && self.columns.is_empty()
            && self.versions_per_column <= 1
            && self.cells.is_none()
    }

    /// Decodes a request's filter; a bad cell filter is an error that names it.
    pub fn from_proto(f: pb::RowFilter) -> Result<ReadFilter, Error> {
        Ok(ReadFilter {
            families: f.families.iter().map(|s| s.as_str().into()).collect(),
            columns: f
                .columns
                .into_iter()
                .map(|c| (c.family.as_str().into(), c.column))
                .collect(),
            versions_per_column: f.versions_per_column,
            cells: f
                .cells
                .map(|c| CellFilter::from_proto(c, "filter.cells"))
                .transpose()?,
        })
    }

    pub fn to_proto(&self) -> pb::RowFilter {
        pb::RowFilter {
            families: self.families.iter().map(|s| s.to_string()).collect(),
            columns: self
                .columns
                .iter()
                .map(|(family, column)| pb::ColumnRef {
                    family: family.to_string(),
                    column: column.clone(),
                })
                .collect(),
            versions_per_column: self.versions_per_column,
            cells: self.cells.as_ref().map(CellFilter::to_proto),
        }
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

/// The expiry bucket of counter increments under a TTL: an increment counts
/// until the end of its wall-clock minute plus the TTL.
pub const COUNTER_BUCKET_MS: u64 = 60_000;

/// A counter increment's value: the delta, 8 bytes big-endian.
pub fn count_bytes(n: i64) -> Bytes {
    Bytes::copy_from_slice(&n.to_be_bytes())
}

/// The delta a counter version holds (0 for a value that is not 8 bytes, which
/// [`RowMutation::check_schema`](crate::RowMutation::check_schema) keeps out).
pub fn count_of(value: &[u8]) -> i64 {
    value.try_into().map_or(0, i64::from_be_bytes)
}

/// The purge horizon of `table`'s rows when the replica's is `horizon`: the
/// same, or, for a table that takes event times, moved back by its window's
/// `past` and a millisecond more. A write logged after `horizon` carries an
/// event time at most `past` before its log time, so its cells' version is
/// newer than this: premise I5 holds for the versions rows hold (the module
/// docs, event time).
pub fn table_horizon(table: Option<&TableSchema>, horizon: Timestamp) -> Timestamp {
    match table.and_then(|t| t.event_time) {
        None => horizon,
        Some(w) => Timestamp::new(
            horizon
                .wall_ms()
                .saturating_sub(w.past_ms.saturating_add(1)),
            0,
        ),
    }
}

/// The expiry bucket an increment at `t` falls in: its minute under a TTL, 0
/// (one bucket for ever) without one.
fn bucket_of(t: Timestamp, ttl_ms: Option<u64>) -> u64 {
    match ttl_ms {
        Some(_) => t.wall_ms() / COUNTER_BUCKET_MS * COUNTER_BUCKET_MS,
        None => 0,
    }
}

/// Until when (wall ms, exclusive) increments of `bucket_ms` count.
fn bucket_expires(bucket_ms: u64, ttl_ms: Option<u64>) -> u64 {
    ttl_ms.map_or(u64::MAX, |ttl| {
        bucket_ms
            .saturating_add(COUNTER_BUCKET_MS)
            .saturating_add(ttl)
    })
}

/// The sum of one origin's increments to a counter cell within one expiry
/// bucket, every one of them at or below `up_to` (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Folded {
    /// The newest increment folded in; its origin is the origin of all.
    newest: Version,
    bucket_ms: u64,
    up_to: Timestamp,
    sum: i64,
}

impl Folded {
    fn origin(&self) -> &ReplicaId {
        &self.newest.origin
    }

    /// The place of the fold in its column: one per (origin, bucket).
    fn slot(&self) -> (&ReplicaId, u64) {
        (self.origin(), self.bucket_ms)
    }

    /// The version every increment it holds is at or below: a delete newer than
    /// it removes them all; one not newer had reached the replica that folded
    /// them (I5), so the fold already leaves out what it deleted.
    fn cut(&self) -> Version {
        Version::new(self.up_to, self.origin().clone())
    }

    /// Whether the increment `v` (of bucket `bucket_ms`) is counted here.
    fn counts(&self, v: &Version, bucket_ms: u64) -> bool {
        *self.origin() == v.origin && self.bucket_ms == bucket_ms && v.timestamp <= self.up_to
    }
}

#[derive(Debug, Clone, Eq, Default)]
struct ColumnState {
    /// Maximal range tombstones, sorted.
    range_tombstones: Vec<RangeTombstone>,
    /// Newest first; `None` is a ghost (deleted, kept only when the family has
    /// `max_versions`, to count against it). A counter's increments.
    versions: Vec<(Version, Option<Bytes>)>,
    /// A counter's folded increments, sorted by [`Folded::slot`].
    folded: Vec<Folded>,
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
            && self.folded == other.folded
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
        self.range_tombstones.is_empty() && self.versions.is_empty() && self.folded.is_empty()
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
    /// A counter's folds go when `matches` selects their cut.
    fn delete_where(&mut self, gc: &GcPolicy, matches: impl Fn(&Version) -> bool) {
        self.folded.retain(|f| !matches(&f.cut()));
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

/// A counter column's increments and folds (the module docs, counters).
impl ColumnState {
    /// Whether some fold counts the increment `v` already.
    fn folds(&self, v: &Version, ttl_ms: Option<u64>) -> bool {
        let bucket = bucket_of(v.timestamp, ttl_ms);
        self.folded.iter().any(|f| f.counts(v, bucket))
    }

    /// Joins a fold: per (origin, bucket) the one reaching furthest stays, and
    /// the increments it counts go.
    fn join_fold(&mut self, f: &Folded, ttl_ms: Option<u64>) {
        match self.folded.binary_search_by(|x| x.slot().cmp(&f.slot())) {
            Ok(i) => {
                let x = &mut self.folded[i];
                // Equal reach means equal folds (I5); a faulty peer's other sum
                // under the same reach still resolves alike everywhere.
                if (f.up_to, f) > (x.up_to, &*x) {
                    x.clone_from(f);
                } else {
                    return;
                }
            }
            Err(i) => self.folded.insert(i, f.clone()),
        }
        self.versions
            .retain(|(v, _)| !f.counts(v, bucket_of(v.timestamp, ttl_ms)));
    }

    /// Folds the increments at or below `horizon` (module docs, counters).
    fn fold_to(&mut self, horizon: Timestamp, ttl_ms: Option<u64>) -> bool {
        // Newest first: the increments to fold are the tail.
        let keep = self
            .versions
            .partition_point(|(v, _)| v.timestamp > horizon);
        if keep == self.versions.len() {
            return false;
        }
        for (v, value) in self.versions.split_off(keep) {
            // A ghost (none in a counter family; a faulty peer's) counts nothing.
            let Some(value) = value else { continue };
            let delta = count_of(&value);
            let bucket_ms = bucket_of(v.timestamp, ttl_ms);
            let slot = (&v.origin, bucket_ms);
            match self.folded.binary_search_by(|x| x.slot().cmp(&slot)) {
                Ok(i) => {
                    let f = &mut self.folded[i];
                    f.sum = f.sum.wrapping_add(delta);
                    f.up_to = f.up_to.max(horizon);
                    if v > f.newest {
                        f.newest = v;
                    }
                }
                Err(i) => self.folded.insert(
                    i,
                    Folded {
                        newest: v,
                        bucket_ms,
                        up_to: horizon,
                        sum: delta,
                    },
                ),
            }
        }
        true
    }

    /// Drops increments and folds expired at `now_ms`; whether any was.
    fn expire_counts(&mut self, ttl_ms: Option<u64>, now_ms: u64) -> bool {
        if ttl_ms.is_none() {
            return false;
        }
        let before = self.versions.len() + self.folded.len();
        self.versions
            .retain(|(v, _)| bucket_expires(bucket_of(v.timestamp, ttl_ms), ttl_ms) > now_ms);
        self.folded
            .retain(|f| bucket_expires(f.bucket_ms, ttl_ms) > now_ms);
        self.versions.len() + self.folded.len() != before
    }

    /// Whether [`ColumnState::expire_counts`] would drop anything.
    fn counts_expired(&self, ttl_ms: Option<u64>, now_ms: u64) -> bool {
        ttl_ms.is_some()
            && (self
                .versions
                .iter()
                .any(|(v, _)| bucket_expires(bucket_of(v.timestamp, ttl_ms), ttl_ms) <= now_ms)
                || self
                    .folded
                    .iter()
                    .any(|f| bucket_expires(f.bucket_ms, ttl_ms) <= now_ms))
    }

    /// The counter as a reader sees it at `now_ms`: the sum of its live
    /// increments and folds, the newest of them, and until when (wall ms) that
    /// answer holds. `None` when nothing counts.
    fn count(&self, ttl_ms: Option<u64>, now_ms: u64) -> Option<(i64, &Version, u64)> {
        let mut sum = 0i64;
        let mut newest: Option<&Version> = None;
        let mut until = u64::MAX;
        let increments = self.versions.iter().filter_map(|(v, value)| {
            let value = value.as_ref()?;
            Some((v, count_of(value), bucket_of(v.timestamp, ttl_ms)))
        });
        let folds = self.folded.iter().map(|f| (&f.newest, f.sum, f.bucket_ms));
        for (v, delta, bucket_ms) in increments.chain(folds) {
            let expires = bucket_expires(bucket_ms, ttl_ms);
            if expires <= now_ms {
                continue;
            }
            sum = sum.wrapping_add(delta);
            newest = newest.max(Some(v));
            until = until.min(expires);
        }
        newest.map(|v| (sum, v, until))
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
    /// The row's family names as a set of [`family_bit`]s: a family whose bit
    /// is clear is not in the row, so a sweep asks a row for its counter
    /// families without following its family map.
    family_bits: u64,
}

/// `family`'s bit in [`CompactHint::family_bits`] (of 64, by a hash of the name).
/// Names that share a bit cost only the exact look-up the bit would have spared.
fn family_bit(family: &str) -> u64 {
    use std::hash::Hasher as _;
    let mut h = crate::hash::WordHasher::default();
    h.write(family.as_bytes());
    1 << (h.finish() >> 58)
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
        for (name, fam) in families {
            h.family_bits |= family_bit(name);
            has_empty |= fam.is_empty();
            if let Some(t) = &fam.tombstone {
                tomb(t);
            }
            for col in fam.columns.values() {
                has_empty |= col.is_empty();
                for rt in &col.range_tombstones {
                    tomb(&rt.version);
                }
                // A fold expires with its bucket, after its newest increment
                // would: as old as that is old enough for `none_expired`.
                let folds = col.folded.iter().map(|f| &f.newest);
                for v in col.versions.last().map(|(v, _)| v).into_iter().chain(folds) {
                    let ms = v.timestamp.wall_ms();
                    oldest_ms = Some(oldest_ms.map_or(ms, |o| o.min(ms)));
                }
            }
            newest_bytes += fam
                .columns
                .iter()
                .filter_map(|(column, col)| {
                    // A counter with folds reads as one 8-byte sum, as its
                    // increments (8 bytes each) do.
                    if !col.folded.is_empty() {
                        return Some(column.len() + 8);
                    }
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

/// Whether increments (and folds) of `family` are kept: in a counter family, and
/// in one this replica's schema does not know yet (a family added by an apply
/// that has not reached it: the increments are there when it has). Only a
/// family known to hold cells ignores them, alike everywhere.
fn counts_in(table: Option<&TableSchema>, family: &str) -> bool {
    table
        .and_then(|t| t.family(family))
        .is_none_or(GcPolicy::is_counter)
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

/// Whether tombstone `t` deletes version `v` (strictly older).
fn newer_than(t: &Option<Version>, v: &Version) -> bool {
    t.as_ref().is_some_and(|t| v < t)
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
        // Increments of one cell in one row mutation share its version: one
        // increment of their sum.
        let mut set_cells = std::collections::HashSet::new();
        let mut increments: BTreeMap<(&Arc<str>, &Bytes), i64> = BTreeMap::new();
        for m in mutations.iter().rev() {
            match m {
                Mutation::SetCell {
                    family,
                    column,
                    value,
                } if set_cells.insert((family, column)) => {
                    let gc = gc_of(table, family);
                    // A counter's cells change by increments only (refused
                    // before; ignored alike everywhere if a peer sends one).
                    if !gc.is_counter() {
                        self.set_cell(version, family, column, value, &gc);
                    }
                }
                Mutation::Increment {
                    family,
                    column,
                    delta,
                } => {
                    let sum = increments.entry((family, column)).or_default();
                    *sum = sum.wrapping_add(*delta);
                }
                _ => {}
            }
        }
        for ((family, column), delta) in increments {
            if counts_in(table, family) {
                let gc = gc_of(table, family);
                self.add_count(version, family, column, count_bytes(delta), &gc);
            }
        }
        for m in mutations {
            match m {
                Mutation::SetCell { .. } | Mutation::Increment { .. } => {}
                Mutation::DeleteFromColumn {
                    family,
                    column,
                    range,
                } => {
                    let gc = gc_of(table, family);
                    // A counter is deleted whole (refused with a range before).
                    let range = if gc.is_counter() {
                        TimeRange::ALL
                    } else {
                        *range
                    };
                    self.delete_from_column(version, family, column, range, &gc);
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
        self.in_column(v, family, column, |col, covered| {
            if !covered {
                col.insert(v, Some(value.clone()), gc);
            } else if gc.max_versions.is_some() {
                col.insert(v, None, gc);
            }
        });
    }

    /// Adds one increment (`value`: its delta) to a counter, unless a tombstone
    /// or a fold covers it.
    fn add_count(
        &mut self,
        v: &Version,
        family: &Arc<str>,
        column: &Bytes,
        value: Bytes,
        gc: &GcPolicy,
    ) {
        self.in_column(v, family, column, |col, covered| {
            if !covered && !col.folds(v, gc.ttl_ms) {
                // No `max_versions` on a counter: every increment stays until folded.
                col.insert(v, Some(value), &GcPolicy::default());
            }
        });
    }

    /// Joins another replica's fold into a counter, unless a tombstone covers it.
    fn merge_fold(&mut self, f: &Folded, family: &Arc<str>, column: &Bytes, gc: &GcPolicy) {
        self.in_column(&f.cut(), family, column, |col, covered| {
            if !covered {
                col.join_fold(f, gc.ttl_ms);
            }
        });
    }

    /// Changes one column with `change(column, covered)`, `covered` when a row,
    /// family or column tombstone deletes version `v`; then drops the column and
    /// its family if nothing is left of them.
    fn in_column(
        &mut self,
        v: &Version,
        family: &Arc<str>,
        column: &Bytes,
        change: impl FnOnce(&mut ColumnState, bool),
    ) {
        let row_tombstone = &self.tombstone;
        let fam = self.families.entry(family.clone()).or_default();
        let col = fam.columns.entry(column.clone()).or_default();
        let covered =
            newer_than(row_tombstone, v) || newer_than(&fam.tombstone, v) || col.covers(v);
        change(col, covered);
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
                if counts_in(table, name) {
                    for f in &col.folded {
                        self.merge_fold(f, name, column, &gc);
                    }
                    for (v, value) in &col.versions {
                        match value {
                            Some(value) => self.add_count(v, name, column, value.clone(), &gc),
                            None => self.merge_ghost(v, name, column, &gc),
                        }
                    }
                    continue;
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
        let horizon = table_horizon(table, horizon);
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
                if gc.is_counter() {
                    changed |= col.expire_counts(gc.ttl_ms, now_ms);
                    changed |= col.fold_to(horizon, gc.ttl_ms);
                } else if let Some(ttl) = gc.ttl_ms {
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
        let horizon = table_horizon(table, horizon);
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
        if self.counts_to_fold(table, horizon) {
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
            let gc = gc_of(table, name);
            let ttl = gc.ttl_ms;
            if gc.is_counter() {
                return fam.columns.values().any(|col| {
                    col.is_empty()
                        || col
                            .range_tombstones
                            .iter()
                            .any(|rt| rt.version.timestamp <= horizon)
                        || col.counts_expired(ttl, now_ms)
                });
            }
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

    /// Whether some counter of the row holds increments at or below `horizon`,
    /// which [`RowState::compact`] folds.
    fn counts_to_fold(&self, table: Option<&TableSchema>, horizon: Timestamp) -> bool {
        let Some(table) = table else {
            return false;
        };
        table
            .families
            .iter()
            .filter(|(name, gc)| gc.is_counter() && self.hint.family_bits & family_bit(name) != 0)
            .filter_map(|(name, _)| self.families.get(name))
            .flat_map(|fam| fam.columns.values())
            // Newest first: the last increment is the oldest.
            .any(|col| {
                col.versions
                    .last()
                    .is_some_and(|(v, _)| v.timestamp <= horizon)
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
        let horizon = table_horizon(table, horizon);
        if !self.none_expired(table, now_ms) {
            return None;
        }
        // A fold reaches the horizon itself.
        if self.counts_to_fold(table, horizon) {
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
        let per_column = filter.versions_per_column.max(1) as usize;
        match &filter.cells {
            None => self.read_until(key, filter, per_column, table, now_ms).0,
            Some(cells) => {
                let every = self.read_until(key, filter, usize::MAX, table, now_ms).0?;
                cells.apply(every, per_column)
            }
        }
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
        let (row, until_ms) = self.read_until(key, &ReadFilter::default(), 1, table, now_ms);
        (row.map(|r| Bytes::from(r.encode_to_vec())), until_ms)
    }

    /// The newest `per_column` live versions of each column `filter`'s family and
    /// column lists select (its `cells` not applied), and until when (wall ms,
    /// exclusive) that answer holds.
    fn read_until(
        &self,
        key: &Bytes,
        filter: &ReadFilter,
        per_column: usize,
        table: Option<&TableSchema>,
        now_ms: u64,
    ) -> (Option<pb::Row>, u64) {
        let mut until_ms = u64::MAX;
        let mut families = Vec::new();
        for (name, fam) in self
            .families
            .iter()
            .filter(|(name, _)| filter.wants_family(name))
        {
            let gc = gc_of(table, name);
            let ttl = gc.ttl_ms;
            let mut cells = Vec::new();
            let cells_filter = filter.cells.as_ref();
            for (column, col) in fam.columns.iter().filter(|(c, _)| {
                filter.wants_column(name, c)
                    && cells_filter.is_none_or(|f| f.column_may_pass(name, c))
            }) {
                if gc.is_counter() {
                    if let Some((sum, v, until)) = col.count(ttl, now_ms) {
                        until_ms = until_ms.min(until);
                        cells.push(pb::Cell {
                            column: column.clone(),
                            timestamp: v.timestamp.as_u64(),
                            origin: v.origin.to_string(),
                            value: count_bytes(sum),
                        });
                    }
                    continue;
                }
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
                            folded: col
                                .folded
                                .iter()
                                .map(|f| pb::FoldedCount {
                                    newest: Some(f.newest.to_proto()),
                                    bucket_ms: f.bucket_ms,
                                    up_to: f.up_to.as_u64(),
                                    sum: f.sum,
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
                for f in c.folded {
                    let f = Folded {
                        newest: Version::from_proto(f.newest)?,
                        bucket_ms: f.bucket_ms,
                        up_to: Timestamp::from_u64(f.up_to),
                        sum: f.sum,
                    };
                    if col.folded.last().is_some_and(|l| l.slot() >= f.slot()) {
                        return Err(Error::malformed("RowState", "folded counts out of order"));
                    }
                    // A fold reaches at least its newest increment, and its bucket
                    // is that increment's minute (or 0: no TTL).
                    let minute = bucket_of(f.newest.timestamp, Some(0));
                    if f.up_to < f.newest.timestamp || (f.bucket_ms != 0 && f.bucket_ms != minute) {
                        return Err(Error::malformed(
                            "RowState",
                            "a folded count's reach or bucket does not fit its newest increment",
                        ));
                    }
                    col.folded.push(f);
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
                        .chain(c.folded.iter().map(|f| &f.newest))
                }))
            }))
    }

    /// Names of the families this row holds anything of.
    pub fn family_names(&self) -> impl Iterator<Item = &str> {
        self.families.keys().map(|f| &**f)
    }

    /// Whether the row holds folded counts (only compaction makes them; a
    /// loader's merged rows may not carry any).
    pub fn has_folds(&self) -> bool {
        self.families
            .values()
            .flat_map(|f| f.columns.values())
            .any(|c| !c.folded.is_empty())
    }

    /// Whether a tombstone this row holds — of the row, of `family`, or of
    /// `family`:`column` — deletes version `v` of that cell (checkers ask it of
    /// an oracle row, which is never compacted).
    pub fn deletes(&self, family: &str, column: &[u8], v: &Version) -> bool {
        newer_than(&self.tombstone, v)
            || self.families.get(family).is_some_and(|f| {
                newer_than(&f.tombstone, v) || f.columns.get(column).is_some_and(|c| c.covers(v))
            })
    }

    /// Whether what the row holds in `family` fits a family of that kind: a
    /// counter's versions are 8-byte increments, a family of cells has no folds.
    pub fn fits_kind(&self, family: &str, kind: FamilyKind) -> bool {
        let Some(fam) = self.families.get(family) else {
            return true;
        };
        fam.columns.values().all(|c| match kind {
            FamilyKind::Counter => c
                .versions
                .iter()
                .all(|(_, value)| value.as_ref().is_none_or(|b| b.len() == 8)),
            FamilyKind::Cells => c.folded.is_empty(),
        })
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
                let gc = gc_of(table, name);
                let ttl = gc.ttl_ms;
                if gc.is_counter() {
                    return fam
                        .columns
                        .iter()
                        .filter(|(_, col)| col.count(ttl, now_ms).is_some())
                        .map(|(column, _)| column.len() + 8)
                        .sum();
                }
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
                // (Folds go with the column's tombstones, into each part of it.)
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
                    if c.range_tombstones.is_empty() && c.folded.is_empty() {
                        c.range_tombstones.clone_from(&col.range_tombstones);
                        c.folded.clone_from(&col.folded);
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
                    + 8 * c.folded.len()
            })
            .sum()
    }
}
