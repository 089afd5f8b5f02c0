//! The storage trait the replica state machine writes through, and an in-memory
//! implementation for tests and the simulator. `pangea-store` implements it on fjall.
//!
//! The contract (I2): [`Storage::write`] applies a [`WriteBatch`] atomically — a row
//! change, the log entry that caused it and the watermark that entry advances are
//! never separated by a crash. [`Storage::sync`] makes every earlier write durable;
//! drivers acknowledge writes only after it returns (group commit: many writes, one
//! sync).

use crate::hlc::Timestamp;
use crate::ids::{ReplicaId, ScopeId};
use crate::limits::Limits;
use crate::mutation::RowMutation;
use crate::row::RowState;
use crate::{Error, StorageError};
use bytes::Bytes;
use pangea_proto::v1 as pb;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

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
        use pangea_topology::schema::validate_name;
        validate_name("scope", &f.scope)?;
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
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
            && self.log.is_empty()
            && self.watermarks.is_empty()
            && self.truncate_log.is_empty()
            && self.meta.is_empty()
    }
}

/// Durable rows, replication log and watermarks of one replica.
pub trait Storage {
    fn get_row(&self, table: &str, key: &[u8]) -> Result<Option<RowState>, StorageError>;

    /// Rows of `table` whose key starts with `prefix`, in key order, strictly after
    /// `after` when given, at most `limit`.
    fn scan_rows(
        &self,
        table: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Bytes, RowState)>, StorageError>;

    /// Tables holding at least one row, in name order.
    fn tables(&self) -> Result<Vec<Arc<str>>, StorageError>;

    /// Applies `batch` atomically. Not yet durable: see [`Storage::sync`].
    fn write(&mut self, batch: WriteBatch) -> Result<(), StorageError>;

    /// Makes every earlier write durable (fsync).
    fn sync(&mut self) -> Result<(), StorageError>;

    /// Up to `max_entries` log entries of (scope, origin) from sequence `from` on.
    fn read_log(
        &self,
        scope: &ScopeId,
        origin: &ReplicaId,
        from: u64,
        max_entries: usize,
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

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct MemState {
    rows: BTreeMap<(Arc<str>, Bytes), RowState>,
    log: BTreeMap<(ScopeId, ReplicaId, u64), LogEntry>,
    watermarks: BTreeMap<(ScopeId, ReplicaId), Watermark>,
    meta: BTreeMap<String, Bytes>,
}

impl MemState {
    fn apply(&mut self, batch: &WriteBatch) {
        for w in &batch.rows {
            let key = (w.table.clone(), w.key.clone());
            match &w.row {
                Some(row) => self.rows.insert(key, row.clone()),
                None => self.rows.remove(&key),
            };
        }
        for e in &batch.log {
            self.log
                .insert((e.scope.clone(), e.origin.clone(), e.sequence), e.clone());
        }
        for (scope, origin, wm) in &batch.watermarks {
            self.watermarks.insert((scope.clone(), origin.clone()), *wm);
        }
        for (scope, origin, below) in &batch.truncate_log {
            let doomed: Vec<_> = self
                .log
                .range((scope.clone(), origin.clone(), 0)..(scope.clone(), origin.clone(), *below))
                .map(|(k, _)| k.clone())
                .collect();
            for k in doomed {
                self.log.remove(&k);
            }
        }
        for (k, v) in &batch.meta {
            match v {
                Some(v) => self.meta.insert(k.clone(), v.clone()),
                None => self.meta.remove(k),
            };
        }
    }
}

/// In-memory [`Storage`] for tests and the simulator. It models durability: writes
/// since the last [`Storage::sync`] are lost by [`MemStorage::crash`].
#[derive(Debug, Clone, Default)]
pub struct MemStorage {
    /// What reads see.
    current: MemState,
    /// What survives a crash.
    durable: MemState,
    /// Batches written since the last sync, replayed onto `durable` by `sync`.
    unsynced: Vec<WriteBatch>,
}

impl MemStorage {
    pub fn new() -> Self {
        Self::default()
    }

    /// Loses every write not yet synced, as a `kill -9` would.
    pub fn crash(&mut self) {
        self.current = self.durable.clone();
        self.unsynced.clear();
    }

    /// Number of rows held.
    pub fn row_count(&self) -> usize {
        self.current.rows.len()
    }

    /// Every row in (table, key) order, for digests and checkers.
    pub fn rows(&self) -> impl Iterator<Item = (&Arc<str>, &Bytes, &RowState)> {
        self.current.rows.iter().map(|((t, k), r)| (t, k, r))
    }
}

impl Storage for MemStorage {
    fn get_row(&self, table: &str, key: &[u8]) -> Result<Option<RowState>, StorageError> {
        Ok(self
            .current
            .rows
            .get(&(Arc::from(table), Bytes::copy_from_slice(key)))
            .cloned())
    }

    fn scan_rows(
        &self,
        table: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Bytes, RowState)>, StorageError> {
        let table: Arc<str> = table.into();
        let start = match after {
            Some(a) if a >= prefix => Bound::Excluded((table.clone(), Bytes::copy_from_slice(a))),
            _ => Bound::Included((table.clone(), Bytes::copy_from_slice(prefix))),
        };
        Ok(self
            .current
            .rows
            .range((start, Bound::Unbounded))
            .take_while(|((t, k), _)| *t == table && k.starts_with(prefix))
            .take(limit)
            .map(|((_, k), r)| (k.clone(), r.clone()))
            .collect())
    }

    fn tables(&self) -> Result<Vec<Arc<str>>, StorageError> {
        let mut tables: Vec<Arc<str>> = self.current.rows.keys().map(|(t, _)| t.clone()).collect();
        tables.dedup();
        Ok(tables)
    }

    fn write(&mut self, batch: WriteBatch) -> Result<(), StorageError> {
        self.current.apply(&batch);
        self.unsynced.push(batch);
        Ok(())
    }

    fn sync(&mut self) -> Result<(), StorageError> {
        for batch in self.unsynced.drain(..) {
            self.durable.apply(&batch);
        }
        Ok(())
    }

    fn read_log(
        &self,
        scope: &ScopeId,
        origin: &ReplicaId,
        from: u64,
        max_entries: usize,
    ) -> Result<Vec<LogEntry>, StorageError> {
        Ok(self
            .current
            .log
            .range(
                (scope.clone(), origin.clone(), from)..=(scope.clone(), origin.clone(), u64::MAX),
            )
            .take(max_entries)
            .map(|(_, e)| e.clone())
            .collect())
    }

    fn log_bounds(
        &self,
        scope: &ScopeId,
        origin: &ReplicaId,
    ) -> Result<Option<(u64, u64)>, StorageError> {
        let mut range = self
            .current
            .log
            .range((scope.clone(), origin.clone(), 0)..=(scope.clone(), origin.clone(), u64::MAX));
        let first = range.next().map(|(k, _)| k.2);
        let last = range.next_back().map(|(k, _)| k.2).or(first);
        Ok(first.zip(last))
    }

    fn watermarks(&self) -> Result<Vec<(ScopeId, ReplicaId, Watermark)>, StorageError> {
        Ok(self
            .current
            .watermarks
            .iter()
            .map(|((s, o), w)| (s.clone(), o.clone(), *w))
            .collect())
    }

    fn meta(&self, key: &str) -> Result<Option<Bytes>, StorageError> {
        Ok(self.current.meta.get(key).cloned())
    }
}
