//! The storage trait the replica state machine writes through, and the types it
//! takes: `pangea-store` implements it on fjall, [`MemStorage`] (`mem`) in memory
//! for tests and the simulator.
//!
//! The contract (I2): [`Storage::write`] applies a [`WriteBatch`] atomically — a row
//! change, the log entry that caused it and the watermark that entry advances are
//! never separated by a crash. [`Storage::sync`] makes every earlier write durable;
//! drivers acknowledge writes only after it returns (group commit: many writes, one
//! sync).

use crate::filter::BytesRange;
use crate::hlc::Timestamp;
use crate::ids::{ReplicaId, ScopeId};
use crate::limits::Limits;
use crate::mutation::RowMutation;
use crate::row::{RowState, Version};
use crate::{Error, StorageError};
use bytes::Bytes;
use pangea_proto::v1 as pb;
use pangea_topology::Deployment;
use pangea_topology::schema::TableSchema;
use std::ops::Bound;
use std::sync::Arc;

mod mem;
pub use mem::{MemStorage, RowSharing};

/// How far one origin's stream in one scope has been applied: every sequence up to
/// and including `sequence`, the last of them written at `timestamp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Watermark {
    pub sequence: u64,
    pub timestamp: Timestamp,
}

/// One entry of the replication log: the `sequence`-th write of `origin` in `scope`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub scope: ScopeId,
    pub origin: ReplicaId,
    pub sequence: u64,
    pub timestamp: Timestamp,
    pub mutation: RowMutation,
}

impl LogEntry {
    pub fn to_frame(&self) -> pb::MutationFrame {
        pb::MutationFrame {
            scope: self.scope.to_string(),
            origin: self.origin.to_string(),
            sequence: self.sequence,
            timestamp: self.timestamp.as_u64(),
            mutation: Some(self.mutation.to_proto()),
        }
    }

    /// Estimated encoded size: user payload plus a fixed envelope (names, numbers,
    /// tags). Within a few percent for realistic entries; see `Frame::wire_bytes`.
    pub fn wire_bytes(&self) -> usize {
        self.mutation.payload_bytes() + self.scope.as_str().len() + self.origin.as_str().len() + 48
    }

    /// Parses a frame from a peer or the store, checking names and `limits`.
    pub fn from_frame(f: pb::MutationFrame, limits: &Limits) -> Result<LogEntry, Error> {
        use pangea_topology::schema::{validate_name, validate_scope};
        validate_scope(&f.scope)?;
        validate_name("replica", &f.origin)?;
        if f.sequence == 0 {
            return Err(Error::malformed("MutationFrame", "sequence 0"));
        }
        let mutation = f
            .mutation
            .ok_or_else(|| Error::malformed("MutationFrame", "no mutation"))?;
        Ok(LogEntry {
            scope: f.scope.as_str().into(),
            origin: f.origin.as_str().into(),
            sequence: f.sequence,
            timestamp: Timestamp::from_u64(f.timestamp),
            mutation: RowMutation::from_proto(mutation, limits)?,
        })
    }
}

/// A row to store (`Some`) or delete (`None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowWrite {
    pub table: Arc<str>,
    pub key: Bytes,
    pub row: Option<RowState>,
}

/// Everything one atomic write changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteBatch {
    pub rows: Vec<RowWrite>,
    pub log: Vec<LogEntry>,
    pub watermarks: Vec<(ScopeId, ReplicaId, Watermark)>,
    /// Drop log entries of (scope, origin) with a sequence below the number.
    pub truncate_log: Vec<(ScopeId, ReplicaId, u64)>,
    /// Replica metadata (e.g. the HLC high-water mark); `None` deletes.
    pub meta: Vec<(String, Option<Bytes>)>,
}

impl WriteBatch {
    /// A log entry and its stream's new watermark.
    pub fn of_entry(entry: &LogEntry, wm: Watermark) -> WriteBatch {
        WriteBatch {
            log: vec![entry.clone()],
            watermarks: vec![(entry.scope.clone(), entry.origin.clone(), wm)],
            ..WriteBatch::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
            && self.log.is_empty()
            && self.watermarks.is_empty()
            && self.truncate_log.is_empty()
            && self.meta.is_empty()
    }
}

/// Compaction at one replica: its purge horizon and its clock. I5: everything not
/// yet applied here is newer than the horizon.
#[derive(Debug, Clone, Copy)]
pub struct Compaction<'a> {
    /// Gives the GC policies (the tables' schemas).
    pub deployment: &'a Arc<Deployment>,
    pub horizon: Timestamp,
    pub now_ms: u64,
}

impl Compaction<'_> {
    pub fn schema(&self, table: &str) -> Option<&TableSchema> {
        self.deployment.placement.schema.table(table)
    }

    /// Whether [`Compaction::run`] would change `row` (exact).
    pub fn needs(&self, table: &str, row: &RowState) -> bool {
        row.needs_compact(self.schema(table), self.horizon, self.now_ms)
    }

    /// [`RowState::compact`]; whether the row changed.
    pub fn run(&self, table: &str, row: &mut RowState) -> bool {
        row.compact(self.schema(table), self.horizon, self.now_ms)
    }
}

/// Applying one log entry to its row: the change itself ([`RowApply::change`], a
/// function of the row and the entry alone), then this replica's compaction.
#[derive(Debug, Clone, Copy)]
pub struct RowApply<'a> {
    pub entry: &'a LogEntry,
    pub compaction: Compaction<'a>,
}

impl RowApply<'_> {
    /// The entry's mutations, at its cells' version (its event time, if it has one).
    pub fn change(&self, row: &mut RowState) {
        let e = self.entry;
        let version = e
            .mutation
            .cell_version(&Version::new(e.timestamp, e.origin.clone()));
        let table = self.compaction.schema(e.mutation.table());
        row.apply(&version, e.mutation.mutations(), table);
    }

    /// The change, then compaction if it changes anything.
    pub fn run(&self, row: &mut RowState) {
        self.change(row);
        let table = self.entry.mutation.table();
        if self.compaction.needs(table, row) {
            self.compaction.run(table, row);
        }
    }
}

/// Durable rows, replication log and watermarks of one replica.
pub trait Storage {
    fn get_row(&self, table: &str, key: &[u8]) -> Result<Option<RowState>, StorageError>;

    /// [`RowState::value_bytes`] of a row (0 when absent): what a write's size
    /// check reads. The default copies the row; a store that holds rows in memory
    /// looks without copying.
    fn row_value_bytes(&self, table: &str, key: &[u8]) -> Result<usize, StorageError> {
        Ok(self.get_row(table, key)?.map_or(0, |r| r.value_bytes()))
    }

    /// Rows of `table` whose key is in `range`, at most `limit`, in key order:
    /// ascending, or descending when `reverse`.
    fn scan_range(
        &self,
        table: &str,
        range: &BytesRange,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<(Bytes, RowState)>, StorageError>;

    /// Rows of `table` whose key starts with `prefix`, in key order, strictly after
    /// `after` when given, at most `limit`.
    fn scan_rows(
        &self,
        table: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Bytes, RowState)>, StorageError> {
        let mut range = BytesRange::prefix(prefix);
        if let Some(after) = after {
            range = range.intersect(&BytesRange {
                start: Bound::Excluded(Bytes::copy_from_slice(after)),
                end: Bound::Unbounded,
            });
        }
        self.scan_range(table, &range, false, limit)
    }

    /// [`Storage::scan_rows`] without the copies: calls `f` with each row in turn,
    /// and returns the last key visited (where a scan resumes). The default copies
    /// through `scan_rows`; a store that holds its rows in memory lends them.
    fn visit_rows(
        &self,
        table: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        f: &mut dyn FnMut(&Bytes, &RowState),
    ) -> Result<Option<Bytes>, StorageError> {
        let mut last = None;
        for (key, row) in self.scan_rows(table, prefix, after, limit)? {
            f(&key, &row);
            last = Some(key);
        }
        Ok(last)
    }

    /// Tables holding at least one row, in name order.
    fn tables(&self) -> Result<Vec<Arc<str>>, StorageError>;

    /// Applies `batch` atomically. Not yet durable: see [`Storage::sync`].
    fn write(&mut self, batch: WriteBatch) -> Result<(), StorageError>;

    /// The read-modify-write of applying an entry: reads the row at (`table`, `key`)
    /// (empty when absent), lets `update` change it, and writes it (deleted when left
    /// empty) atomically with `batch`: both or neither. `batch` must not write that
    /// row itself. The default goes through [`Storage::get_row`] and
    /// [`Storage::write`]; a store may update the row in place if its write of
    /// `batch` cannot then fail.
    fn update_row(
        &mut self,
        table: &Arc<str>,
        key: &Bytes,
        update: &mut dyn FnMut(&mut RowState),
        mut batch: WriteBatch,
    ) -> Result<(), StorageError> {
        let mut row = self.get_row(table, key)?.unwrap_or_default();
        update(&mut row);
        batch.rows.push(RowWrite {
            table: table.clone(),
            key: key.clone(),
            row: (!row.is_empty()).then_some(row),
        });
        self.write(batch)
    }

    /// Applies a log entry to its row ([`RowApply::run`]) atomically with `batch`,
    /// as [`Storage::update_row`] does. A store may take the row another store
    /// computed from the same row and entry ([`MemStorage::share_rows`]).
    fn apply_to_row(&mut self, a: &RowApply<'_>, batch: WriteBatch) -> Result<(), StorageError> {
        let m = &a.entry.mutation;
        self.update_row(m.table(), m.row_key(), &mut |row| a.run(row), batch)
    }

    /// Appends a log entry and moves its stream's watermark to `wm`, atomically:
    /// [`Storage::write`] of that batch, which is the default.
    fn append_entry(&mut self, entry: &LogEntry, wm: Watermark) -> Result<(), StorageError> {
        self.write(WriteBatch::of_entry(entry, wm))
    }

    /// [`Storage::apply_to_row`] with the batch of [`Storage::append_entry`]: how a
    /// replica applies an entry whose row it holds.
    fn apply_entry_to_row(&mut self, a: &RowApply<'_>, wm: Watermark) -> Result<(), StorageError> {
        self.apply_to_row(a, WriteBatch::of_entry(a.entry, wm))
    }

    /// Compacts the rows of `table` at `keys` (those [`Compaction::needs`] named);
    /// rows left empty are deleted. Compaction changes nothing a reader sees, so
    /// the rows need not be written together.
    fn compact_rows(
        &mut self,
        table: &Arc<str>,
        keys: Vec<Bytes>,
        c: &Compaction<'_>,
    ) -> Result<(), StorageError> {
        let mut batch = WriteBatch::default();
        for key in keys {
            let Some(mut row) = self.get_row(table, &key)? else {
                continue;
            };
            c.run(table, &mut row);
            batch.rows.push(RowWrite {
                table: table.clone(),
                key,
                row: (!row.is_empty()).then_some(row),
            });
        }
        self.write(batch)
    }

    /// Makes every earlier write durable (fsync).
    fn sync(&mut self) -> Result<(), StorageError>;

    /// Up to `max_entries` log entries of (scope, origin) from sequence `from` on,
    /// and no more than `max_bytes` of them by [`LogEntry::wire_bytes`] — except
    /// the first, which comes whatever its size, so a reader always progresses.
    fn read_log(
        &self,
        scope: &ScopeId,
        origin: &ReplicaId,
        from: u64,
        max_entries: usize,
        max_bytes: usize,
    ) -> Result<Vec<LogEntry>, StorageError>;

    /// First and last retained sequence of (scope, origin), if any.
    fn log_bounds(
        &self,
        scope: &ScopeId,
        origin: &ReplicaId,
    ) -> Result<Option<(u64, u64)>, StorageError>;

    /// Every stored watermark.
    fn watermarks(&self) -> Result<Vec<(ScopeId, ReplicaId, Watermark)>, StorageError>;

    fn meta(&self, key: &str) -> Result<Option<Bytes>, StorageError>;
}
