//! [`MemStorage`]: the storage trait in memory, for tests and the simulator — with
//! a crash model (what each write replaced until the next sync) for drills that
//! kill replicas, and a hook ([`RowSharing`]) through which the stores of one run
//! can share rows (the simulator's `shared_rows` implements it).

use super::{Compaction, LogEntry, RowApply, Storage, Watermark, WriteBatch};
use crate::StorageError;
use crate::filter::BytesRange;
use crate::idmap::IdMap;
use crate::ids::{ReplicaId, ScopeId};
use crate::row::RowState;
use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

/// One (scope, origin) stream's log, by sequence.
///
/// A replica appends a stream in order and truncates it from the front, so the
/// entries are held in a ring while they stay contiguous (an append is a push);
/// anything else (a gap, a removal in the middle) turns the log into a map, which
/// takes any sequence.
#[derive(Debug, Clone)]
enum StreamLog {
    /// `entries[i]` has sequence `first + i`.
    Ring {
        first: u64,
        entries: VecDeque<LogEntry>,
    },
    Map(BTreeMap<u64, LogEntry>),
}

impl Default for StreamLog {
    fn default() -> Self {
        StreamLog::Ring {
            first: 0,
            entries: VecDeque::new(),
        }
    }
}

impl StreamLog {
    fn is_empty(&self) -> bool {
        match self {
            StreamLog::Ring { entries, .. } => entries.is_empty(),
            StreamLog::Map(m) => m.is_empty(),
        }
    }

    /// The log as a map, from now on.
    fn map(&mut self) -> &mut BTreeMap<u64, LogEntry> {
        if let StreamLog::Ring { first, entries } = self {
            let m = std::mem::take(entries)
                .into_iter()
                .enumerate()
                .map(|(i, e)| (*first + i as u64, e))
                .collect();
            *self = StreamLog::Map(m);
        }
        match self {
            StreamLog::Map(m) => m,
            StreamLog::Ring { .. } => unreachable!("turned into a map above"),
        }
    }

    /// Stores `e` at `sequence`; returns what was there.
    fn insert(&mut self, sequence: u64, e: LogEntry) -> Option<LogEntry> {
        if let StreamLog::Ring { first, entries } = self {
            let end = *first + entries.len() as u64;
            if entries.is_empty() {
                *first = sequence;
                entries.push_back(e);
                return None;
            } else if sequence == end {
                entries.push_back(e);
                return None;
            } else if sequence + 1 == *first {
                *first = sequence;
                entries.push_front(e);
                return None;
            } else if (*first..end).contains(&sequence) {
                return Some(std::mem::replace(
                    &mut entries[(sequence - *first) as usize],
                    e,
                ));
            }
        }
        self.map().insert(sequence, e)
    }

    fn remove(&mut self, sequence: u64) -> Option<LogEntry> {
        if let StreamLog::Ring { first, entries } = self {
            let end = *first + entries.len() as u64;
            if !(*first..end).contains(&sequence) {
                return None;
            } else if sequence + 1 == end {
                return entries.pop_back();
            } else if sequence == *first {
                *first += 1;
                return entries.pop_front();
            }
        }
        self.map().remove(&sequence)
    }

    /// Removes and returns the entries below `below`.
    fn split_below(&mut self, below: u64) -> StreamLog {
        match self {
            StreamLog::Ring { first, entries } => {
                let n = below.saturating_sub(*first).min(entries.len() as u64) as usize;
                let older = StreamLog::Ring {
                    first: *first,
                    entries: entries.drain(..n).collect(),
                };
                *first += n as u64;
                older
            }
            StreamLog::Map(m) => {
                let kept = m.split_off(&below);
                StreamLog::Map(std::mem::replace(m, kept))
            }
        }
    }

    /// Puts back entries `split_below` removed (all older than any held here).
    fn prepend(&mut self, mut older: StreamLog) {
        if let (
            StreamLog::Ring { first, entries },
            StreamLog::Ring {
                first: older_first,
                entries: older_entries,
            },
        ) = (&mut *self, &mut older)
            && (entries.is_empty() || *older_first + older_entries.len() as u64 == *first)
        {
            older_entries.append(entries);
            *first = *older_first;
            *entries = std::mem::take(older_entries);
            return;
        }
        let mut m = std::mem::take(older.map());
        m.append(self.map());
        *self = StreamLog::Map(m);
    }

    /// Entries from sequence `from` on, in order.
    fn from(&self, from: u64) -> Box<dyn Iterator<Item = &LogEntry> + '_> {
        match self {
            StreamLog::Ring { first, entries } => {
                let skip = from.saturating_sub(*first).min(entries.len() as u64) as usize;
                Box::new(entries.range(skip..))
            }
            StreamLog::Map(m) => Box::new(m.range(from..).map(|(_, e)| e)),
        }
    }

    /// First and last sequence held.
    fn bounds(&self) -> Option<(u64, u64)> {
        match self {
            StreamLog::Ring { first, entries } => {
                (!entries.is_empty()).then(|| (*first, *first + entries.len() as u64 - 1))
            }
            StreamLog::Map(m) => Some((*m.first_key_value()?.0, *m.last_key_value()?.0)),
        }
    }
}

/// A value per (scope, origin) stream, nested so that lookups borrow the ids.
type ByStream<T> = BTreeMap<ScopeId, IdMap<T>>;

fn put_log_in(stream: &mut StoredStream, e: LogEntry, undo: Option<&mut Vec<Undo>>) {
    let sequence = e.sequence;
    match undo {
        Some(undo) => {
            let key = (e.scope.clone(), e.origin.clone());
            let old = stream.log.insert(sequence, e);
            undo.push(Undo::Log {
                stream: key,
                sequence,
                old,
            });
        }
        None => {
            stream.log.insert(sequence, e);
        }
    }
}

fn put_watermark_in(
    stream: &mut StoredStream,
    scope: &ScopeId,
    origin: &ReplicaId,
    wm: Watermark,
    undo: Option<&mut Vec<Undo>>,
) {
    let old = stream.watermark.replace(wm);
    if let Some(undo) = undo {
        undo.push(Undo::Watermark {
            stream: (scope.clone(), origin.clone()),
            old,
        });
    }
}

/// The streams of `scope`, inserted if absent (the id is copied only then).
fn origins_mut<'a, T>(m: &'a mut ByStream<T>, scope: &ScopeId) -> &'a mut IdMap<T> {
    if !m.contains_key(scope) {
        m.insert(scope.clone(), IdMap::default());
    }
    m.get_mut(scope).expect("inserted above")
}

/// A row key of a [`MemState`]: the bytes, in their order, compared a word at a
/// time where they can be. A B-tree search compares a dozen keys; through `[u8]`'s
/// order each is a `memcmp` call, while keys of one length from 8 to 16 bytes (the
/// usual shape, such as `g/00001234`) order as two big-endian words: the first 8
/// bytes, then the last 8 (overlapping the first where shorter, and equal there).
/// Lookups by `&[u8]` (through `Borrow`) see the same order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RowKey(Bytes);

impl Ord for RowKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        key_order(&self.0, &other.0)
    }
}

impl PartialOrd for RowKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl std::borrow::Borrow<[u8]> for RowKey {
    fn borrow(&self) -> &[u8] {
        &self.0
    }
}

/// `a.cmp(b)`, in words for keys of one length from 8 to 16 bytes (see [`RowKey`]).
fn key_order(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    let n = a.len();
    if n == b.len() && (8..=16).contains(&n) {
        let word = |s: &[u8], at: usize| {
            u64::from_be_bytes(s[at..at + 8].try_into().expect("8 bytes in range"))
        };
        return word(a, 0)
            .cmp(&word(b, 0))
            .then_with(|| word(a, n - 8).cmp(&word(b, n - 8)));
    }
    a.cmp(b)
}

#[derive(Debug, Clone, Default)]
struct MemState {
    /// Rows by table, then key: lookups borrow the caller's `&str` and `&[u8]`, or
    /// take a [`RowKey`] (a copy of the caller's `Bytes`) on the hot paths.
    /// Each row in an `Arc`: shared with other stores under [`MemStorage::share_rows`],
    /// and recorded for a crash without a copy.
    rows: BTreeMap<Arc<str>, BTreeMap<RowKey, Arc<RowState>>>,
    /// Each stream's log and stored watermark, by scope then origin: looked up by
    /// borrowed ids, once for both halves of an applied entry.
    streams: ByStream<StoredStream>,
    meta: BTreeMap<String, Bytes>,
}

/// One stream in a [`MemState`]: its log by sequence, and its watermark if one was
/// written.
#[derive(Debug, Clone, Default)]
struct StoredStream {
    log: StreamLog,
    watermark: Option<Watermark>,
}

/// What one change replaced, so that a crash can put it back.
#[derive(Debug, Clone)]
enum Undo {
    Row {
        table: Arc<str>,
        key: Bytes,
        old: Option<Arc<RowState>>,
    },
    Log {
        stream: (ScopeId, ReplicaId),
        sequence: u64,
        old: Option<LogEntry>,
    },
    Truncated {
        stream: (ScopeId, ReplicaId),
        entries: StreamLog,
    },
    Watermark {
        stream: (ScopeId, ReplicaId),
        old: Option<Watermark>,
    },
    Meta {
        key: String,
        old: Option<Bytes>,
    },
}

impl MemState {
    /// Applies `batch`, moving its contents in, and records in `undo` (when given)
    /// what each change replaced; without it, what was replaced is dropped at once
    /// (and no record is built).
    fn apply(&mut self, batch: WriteBatch, mut undo: Option<&mut Vec<Undo>>) {
        for w in batch.rows {
            let old = match w.row {
                Some(row) => self
                    .rows
                    .entry(w.table.clone())
                    .or_default()
                    .insert(RowKey(w.key.clone()), Arc::new(row)),
                None => self
                    .rows
                    .get_mut(&w.table)
                    .and_then(|t| t.remove(&w.key[..])),
            };
            if let Some(undo) = undo.as_deref_mut() {
                undo.push(Undo::Row {
                    table: w.table,
                    key: w.key,
                    old,
                });
            }
        }
        for e in batch.log {
            self.put_log(e, undo.as_deref_mut());
        }
        for (scope, origin, wm) in batch.watermarks {
            self.put_watermark(&scope, &origin, wm, undo.as_deref_mut());
        }
        for (scope, origin, below) in batch.truncate_log {
            if let Some(stream) = self
                .streams
                .get_mut(&scope)
                .and_then(|l| l.get_mut(&origin))
            {
                let entries = stream.log.split_below(below);
                if let Some(undo) = undo.as_deref_mut()
                    && !entries.is_empty()
                {
                    undo.push(Undo::Truncated {
                        stream: (scope, origin),
                        entries,
                    });
                }
            }
        }
        for (key, v) in batch.meta {
            let old = match v {
                Some(v) => self.meta.insert(key.clone(), v),
                None => self.meta.remove(&key),
            };
            if let Some(undo) = undo.as_deref_mut() {
                undo.push(Undo::Meta { key, old });
            }
        }
    }

    /// Runs `f` on the stream of (`scope`, `origin`), inserted if absent (the ids
    /// are copied only then).
    fn with_stream<R>(
        &mut self,
        scope: &ScopeId,
        origin: &ReplicaId,
        f: impl FnOnce(&mut StoredStream) -> R,
    ) -> R {
        f(origins_mut(&mut self.streams, scope).get_or_default(origin))
    }

    fn put_log(&mut self, e: LogEntry, undo: Option<&mut Vec<Undo>>) {
        let st = origins_mut(&mut self.streams, &e.scope).get_or_default(&e.origin);
        put_log_in(st, e, undo);
    }

    fn put_watermark(
        &mut self,
        scope: &ScopeId,
        origin: &ReplicaId,
        wm: Watermark,
        undo: Option<&mut Vec<Undo>>,
    ) {
        self.with_stream(scope, origin, |st| {
            put_watermark_in(st, scope, origin, wm, undo);
        });
    }

    /// [`MemState::put_log`] then [`MemState::put_watermark`] of the entry's
    /// stream, which is looked up once.
    fn put_entry(&mut self, e: LogEntry, wm: Watermark, mut undo: Option<&mut Vec<Undo>>) {
        // The watermark's record names the stream: copied only for the crash model.
        let stream = undo.is_some().then(|| (e.scope.clone(), e.origin.clone()));
        let st = origins_mut(&mut self.streams, &e.scope).get_or_default(&e.origin);
        put_log_in(st, e, undo.as_deref_mut());
        let old = st.watermark.replace(wm);
        if let (Some(undo), Some(stream)) = (undo, stream) {
            undo.push(Undo::Watermark { stream, old });
        }
    }

    /// Reverts one change (records are reverted newest first).
    fn revert(&mut self, u: Undo) {
        match u {
            Undo::Row { table, key, old } => {
                let t = self.rows.entry(table).or_default();
                match old {
                    Some(row) => t.insert(RowKey(key), row),
                    None => t.remove(&key[..]),
                };
            }
            Undo::Log {
                stream: (scope, origin),
                sequence,
                old,
            } => {
                self.with_stream(&scope, &origin, |st| match old {
                    Some(e) => st.log.insert(sequence, e),
                    None => st.log.remove(sequence),
                });
            }
            Undo::Truncated {
                stream: (scope, origin),
                entries,
            } => {
                self.with_stream(&scope, &origin, |st| st.log.prepend(entries));
            }
            Undo::Watermark {
                stream: (scope, origin),
                old,
            } => {
                self.with_stream(&scope, &origin, |st| st.watermark = old);
            }
            Undo::Meta { key, old } => {
                match old {
                    Some(v) => self.meta.insert(key, v),
                    None => self.meta.remove(&key),
                };
            }
        }
    }
}

/// Rows shared between the in-memory stores of one process: an optimization of
/// the simulator, where every replica applies every write to rows most of them
/// hold identically. Exact: each method returns what computing would have.
pub trait RowSharing: std::fmt::Debug + Send + Sync {
    /// [`RowApply::change`] applied to `row` (`None`: no row yet).
    fn apply(&self, row: Option<&Arc<RowState>>, a: &RowApply<'_>) -> Arc<RowState>;
    /// `row` (of `table`, at `row_key`) compacted by `c` if that changes it.
    fn compact(
        &self,
        row: Arc<RowState>,
        at: (&Arc<str>, &Bytes),
        c: &Compaction<'_>,
    ) -> Arc<RowState>;
}

/// In-memory [`Storage`] for tests and the simulator. It models durability: writes
/// since the last [`Storage::sync`] are lost by [`MemStorage::crash`].
///
/// One copy of the state is kept: each write records what it replaced (moved out,
/// not copied: rows are held in `Arc`s, so a row changed in place is copied only
/// while the record still holds it), a sync forgets those records, and a crash
/// reverts them newest first, which leaves exactly the state as of the last sync.
///
/// A driver that never crashes a store can turn that record off
/// ([`MemStorage::set_crash_model`]): rows are then changed in place without a
/// copy, and writes drop what they replaced at once. Stores of one process can
/// also share rows ([`MemStorage::share_rows`], [`RowSharing`]).
#[derive(Debug, Clone, Default)]
pub struct MemStorage {
    /// What reads see.
    current: MemState,
    /// What the writes since the last sync replaced, oldest first.
    unsynced: Vec<Undo>,
    /// No crash will come: keep no record of what writes replaced.
    no_crash_model: bool,
    /// Rows shared with other stores ([`MemStorage::share_rows`]).
    shared: Option<Arc<dyn RowSharing>>,
}

impl MemStorage {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether writes keep what they replaced until the next sync, so that
    /// [`MemStorage::crash`] can lose them (the default). Off, `update_row` copies
    /// nothing and `crash` is a programming error. Set it before the first write:
    /// turning it on later treats writes made while it was off as synced.
    pub fn set_crash_model(&mut self, on: bool) {
        self.no_crash_model = !on;
        if !on {
            self.unsynced.clear();
        }
    }

    /// Shares rows with every store given the same `shared` ([`RowSharing`]): an
    /// entry another of them already applied to the same row is applied by taking
    /// its result. Reads, digests and everything else see exactly what they would
    /// without it.
    pub fn share_rows(&mut self, shared: Arc<dyn RowSharing>) {
        self.shared = Some(shared);
    }

    /// Loses every write not yet synced, as a `kill -9` would.
    ///
    /// # Panics
    /// When the crash model is off ([`MemStorage::set_crash_model`]).
    pub fn crash(&mut self) {
        assert!(
            !self.no_crash_model,
            "MemStorage::crash with the crash model off"
        );
        while let Some(u) = self.unsynced.pop() {
            self.current.revert(u);
        }
    }

    /// Number of rows held.
    pub fn row_count(&self) -> usize {
        self.current.rows.values().map(BTreeMap::len).sum()
    }

    /// Every row in (table, key) order, for digests and checkers.
    pub fn rows(&self) -> impl Iterator<Item = (&Arc<str>, &Bytes, &RowState)> {
        self.row_arcs().map(|(t, k, r)| (t, k, &**r))
    }

    /// [`MemStorage::rows`] as held: a row shared with other stores
    /// ([`MemStorage::share_rows`]) is one `Arc` among them.
    pub fn row_arcs(&self) -> impl Iterator<Item = (&Arc<str>, &Bytes, &Arc<RowState>)> {
        self.current
            .rows
            .iter()
            .flat_map(|(t, rows)| rows.iter().map(move |(k, r)| (t, &k.0, r)))
    }

    /// A row, borrowed: [`Storage::get_row`] without the copy, for drivers that
    /// only look at it (the simulator measures served rows).
    pub fn row(&self, table: &str, key: &[u8]) -> Option<&RowState> {
        self.current
            .rows
            .get(table)
            .and_then(|t| t.get(key))
            .map(|r| &**r)
    }

    /// [`MemStorage::row`] of a key held as `Bytes`: the search compares keys a
    /// word at a time (`RowKey`).
    pub fn row_at(&self, table: &str, key: &Bytes) -> Option<&RowState> {
        self.current
            .rows
            .get(table)
            .and_then(|t| t.get(&RowKey(key.clone())))
            .map(|r| &**r)
    }

    /// Stores `row` at (`table`, `key`), or deletes it when empty, recording what it
    /// replaced for a crash.
    fn replace_row(&mut self, table: &Arc<str>, key: &Bytes, row: Arc<RowState>) {
        let rows = self.current.rows.entry(table.clone()).or_default();
        let old = if row.is_empty() {
            rows.remove(&RowKey(key.clone()))
        } else {
            rows.insert(RowKey(key.clone()), row)
        };
        if !self.no_crash_model {
            self.unsynced.push(Undo::Row {
                table: table.clone(),
                key: key.clone(),
                old,
            });
        }
    }

    /// The row part of [`Storage::update_row`]: in place, one descent, and a copy of
    /// the old row only for the crash model.
    fn update_row_only(
        &mut self,
        table: &Arc<str>,
        key: &Bytes,
        update: &mut dyn FnMut(&mut RowState),
    ) {
        let rows = self.current.rows.entry(table.clone()).or_default();
        let k = RowKey(key.clone());
        let old = match rows.get_mut(&k) {
            Some(row) => {
                let old = (!self.no_crash_model).then(|| row.clone());
                // Copied first only if shared (with the crash record or other stores).
                update(Arc::make_mut(row));
                if row.is_empty() {
                    rows.remove(&k);
                }
                old
            }
            None => {
                let mut row = RowState::default();
                update(&mut row);
                if !row.is_empty() {
                    rows.insert(k, Arc::new(row));
                }
                None
            }
        };
        if !self.no_crash_model {
            self.unsynced.push(Undo::Row {
                table: table.clone(),
                key: key.clone(),
                old,
            });
        }
    }

    /// The row part of [`Storage::apply_to_row`]. With shared rows: a row no other
    /// store (or crash record) holds is changed in place; a shared one is replaced by
    /// the shared result.
    fn apply_row(&mut self, a: &RowApply<'_>) {
        let m = &a.entry.mutation;
        let Some(shared) = &self.shared else {
            self.update_row_only(m.table(), m.row_key(), &mut |row| a.run(row));
            return;
        };
        let (table, key) = (m.table(), m.row_key());
        let rows = match self.current.rows.get_mut(&**table) {
            Some(rows) => rows,
            None => self.current.rows.entry(table.clone()).or_default(),
        };
        let k = RowKey(key.clone());
        let row = match rows.get_mut(&k) {
            Some(row) if self.no_crash_model && Arc::strong_count(row) == 1 => {
                a.run(Arc::make_mut(row)); // held here alone: no copy
                if row.is_empty() {
                    rows.remove(&k);
                }
                return;
            }
            row => row,
        };
        let changed = shared.apply(row.as_deref(), a);
        let next = shared.compact(changed, (table, key), &a.compaction);
        match row {
            // Replaced where it is: no second search, no key copy.
            Some(row) if self.no_crash_model => {
                if next.is_empty() {
                    rows.remove(&k);
                } else {
                    *row = next;
                }
            }
            _ => self.replace_row(table, key, next),
        }
    }

    fn stream_log(&self, scope: &ScopeId, origin: &ReplicaId) -> Option<&StreamLog> {
        self.current.streams.get(scope)?.get(origin).map(|s| &s.log)
    }
}

impl Storage for MemStorage {
    fn get_row(&self, table: &str, key: &[u8]) -> Result<Option<RowState>, StorageError> {
        Ok(self.row(table, key).cloned())
    }

    fn row_value_bytes(&self, table: &str, key: &[u8]) -> Result<usize, StorageError> {
        Ok(self.row(table, key).map_or(0, RowState::value_bytes))
    }

    fn scan_range(
        &self,
        table: &str,
        range: &BytesRange,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<(Bytes, RowState)>, StorageError> {
        let Some(rows) = self.current.rows.get(table) else {
            return Ok(Vec::new());
        };
        // `BTreeMap::range` panics on a range that ends before it starts.
        if range.is_empty() {
            return Ok(Vec::new());
        }
        let bounds = (
            range.start.as_ref().map(|b| &b[..]),
            range.end.as_ref().map(|b| &b[..]),
        );
        let found = rows.range::<[u8], _>(bounds);
        let copy = |(k, r): (&RowKey, &Arc<RowState>)| (k.0.clone(), RowState::clone(r));
        Ok(if reverse {
            found.rev().take(limit).map(copy).collect()
        } else {
            found.take(limit).map(copy).collect()
        })
    }

    fn visit_rows(
        &self,
        table: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        f: &mut dyn FnMut(&Bytes, &RowState),
    ) -> Result<Option<Bytes>, StorageError> {
        let Some(rows) = self.current.rows.get(table) else {
            return Ok(None);
        };
        let start = match after {
            Some(a) if a >= prefix => Bound::Excluded(a),
            _ => Bound::Included(prefix),
        };
        let mut last = None;
        rows.range::<[u8], _>((start, Bound::Unbounded))
            .take_while(|(k, _)| prefix.is_empty() || k.0.starts_with(prefix))
            .take(limit)
            .for_each(|(k, r)| {
                f(&k.0, r);
                last = Some(&k.0);
            });
        Ok(last.cloned())
    }

    fn tables(&self) -> Result<Vec<Arc<str>>, StorageError> {
        Ok(self
            .current
            .rows
            .iter()
            .filter(|(_, rows)| !rows.is_empty())
            .map(|(t, _)| t.clone())
            .collect())
    }

    fn write(&mut self, batch: WriteBatch) -> Result<(), StorageError> {
        let undo = (!self.no_crash_model).then_some(&mut self.unsynced);
        self.current.apply(batch, undo);
        Ok(())
    }

    /// In place: one descent, and a copy of the old row only for the crash model.
    fn update_row(
        &mut self,
        table: &Arc<str>,
        key: &Bytes,
        update: &mut dyn FnMut(&mut RowState),
        batch: WriteBatch,
    ) -> Result<(), StorageError> {
        self.update_row_only(table, key, update);
        self.write(batch)
    }

    /// With shared rows: a row no other store (or crash record) holds is changed in
    /// place; a shared one is replaced by the shared result.
    fn apply_to_row(&mut self, a: &RowApply<'_>, batch: WriteBatch) -> Result<(), StorageError> {
        self.apply_row(a);
        self.write(batch)
    }

    /// No batch: the entry and the watermark go straight in.
    fn append_entry(&mut self, entry: &LogEntry, wm: Watermark) -> Result<(), StorageError> {
        let undo = (!self.no_crash_model).then_some(&mut self.unsynced);
        self.current.put_entry(entry.clone(), wm, undo);
        Ok(())
    }

    fn apply_entry_to_row(&mut self, a: &RowApply<'_>, wm: Watermark) -> Result<(), StorageError> {
        self.apply_row(a);
        self.append_entry(a.entry, wm)
    }

    fn compact_rows(
        &mut self,
        table: &Arc<str>,
        keys: Vec<Bytes>,
        c: &Compaction<'_>,
    ) -> Result<(), StorageError> {
        for key in keys {
            let k = RowKey(key);
            let Some(row) = self.current.rows.get_mut(table).and_then(|t| t.get_mut(&k)) else {
                continue;
            };
            if self.no_crash_model && Arc::strong_count(row) == 1 {
                c.run(table, Arc::make_mut(row)); // held here alone: no copy
                if row.is_empty() {
                    self.current.rows.get_mut(table).map(|t| t.remove(&k));
                }
                continue;
            }
            let key = k.0;
            let next = match &self.shared {
                Some(shared) => shared.compact(row.clone(), (table, &key), c),
                None => {
                    let mut next = RowState::clone(row);
                    c.run(table, &mut next);
                    Arc::new(next)
                }
            };
            self.replace_row(table, &key, next);
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<(), StorageError> {
        self.unsynced.clear();
        Ok(())
    }

    fn read_log(
        &self,
        scope: &ScopeId,
        origin: &ReplicaId,
        from: u64,
        max_entries: usize,
        max_bytes: usize,
    ) -> Result<Vec<LogEntry>, StorageError> {
        let mut bytes = 0usize;
        Ok(self
            .stream_log(scope, origin)
            .map(|log| {
                log.from(from)
                    .take(max_entries)
                    .take_while(|e| {
                        let first = bytes == 0;
                        bytes = bytes.saturating_add(e.wire_bytes());
                        first || bytes <= max_bytes
                    })
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }

    fn log_bounds(
        &self,
        scope: &ScopeId,
        origin: &ReplicaId,
    ) -> Result<Option<(u64, u64)>, StorageError> {
        Ok(self.stream_log(scope, origin).and_then(StreamLog::bounds))
    }

    fn watermarks(&self) -> Result<Vec<(ScopeId, ReplicaId, Watermark)>, StorageError> {
        Ok(self
            .current
            .streams
            .iter()
            .flat_map(|(s, by_origin)| {
                by_origin
                    .iter()
                    .filter_map(move |(o, st)| Some((s.clone(), o.clone(), st.watermark?)))
            })
            .collect())
    }

    fn meta(&self, key: &str) -> Result<Option<Bytes>, StorageError> {
        Ok(self.current.meta.get(key).cloned())
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlc::Timestamp;
    use crate::limits::Limits;
    use crate::mutation::{Mutation, RowMutation};
    use crate::row::Version;
    use crate::storage::RowWrite;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum LogOp {
        Insert(u64),
        Remove(u64),
        /// Truncate below, then (if `true`) put the truncated entries back, as a
        /// crash does.
        Truncate(u64, bool),
    }

    proptest! {
        /// Row keys order exactly as their bytes, in words or not: keys of one
        /// length that differ anywhere (short ones drawn from few bytes, so that
        /// they tie in their first words too), and keys of any lengths.
        #[test]
        fn row_keys_order_as_bytes(
            len in 0usize..20,
            a in prop::collection::vec(prop::sample::select(vec![0u8, 1, 0x7f, 0x80, 0xff]), 20),
            b in prop::collection::vec(prop::sample::select(vec![0u8, 1, 0x7f, 0x80, 0xff]), 20),
            c in prop::collection::vec(any::<u8>(), 0..20),
        ) {
            let (a, b) = (&a[..len], &b[..len]);
            prop_assert_eq!(key_order(a, b), a.cmp(b));
            prop_assert_eq!(key_order(a, a), std::cmp::Ordering::Equal);
            prop_assert_eq!(key_order(a, &c), a.cmp(&c[..]));
            let (x, y) = (RowKey(Bytes::copy_from_slice(a)), RowKey(Bytes::copy_from_slice(&c)));
            prop_assert_eq!(x.cmp(&y), a.cmp(&c[..]));
            prop_assert_eq!(x == y, a == &c[..]);
        }

        /// The ring a stream's log is kept in behaves as a map by sequence: appends,
        /// overwrites, gaps, removals, truncation and its revert, reads and bounds.
        #[test]
        fn stream_log_is_a_map_by_sequence(
            ops in prop::collection::vec(prop_oneof![
                6 => (0u64..40).prop_map(LogOp::Insert),
                2 => (0u64..40).prop_map(LogOp::Remove),
                2 => (0u64..40, any::<bool>()).prop_map(|(b, back)| LogOp::Truncate(b, back)),
            ], 0..60),
            start in 0u64..40,
        ) {
            let mut log = StreamLog::default();
            let mut model: BTreeMap<u64, LogEntry> = BTreeMap::new();
            // Mostly appends in order (as a replica writes), with the ops mixed in.
            let mut next = start;
            for op in ops {
                match op {
                    LogOp::Insert(n) => {
                        let seq = if n % 3 == 0 { n } else { next };
                        next = seq + 1;
                        let e = entry(seq.max(1));
                        prop_assert_eq!(log.insert(seq, e.clone()), model.insert(seq, e));
                    }
                    LogOp::Remove(n) => prop_assert_eq!(log.remove(n), model.remove(&n)),
                    LogOp::Truncate(below, back) => {
                        let older = log.split_below(below);
                        let kept = model.split_off(&below);
                        let older_model = std::mem::replace(&mut model, kept);
                        prop_assert_eq!(older.from(0).cloned().collect::<Vec<_>>(), older_model.values().cloned().collect::<Vec<_>>());
                        if back {
                            log.prepend(older);
                            let mut m = older_model;
                            m.append(&mut model);
                            model = m;
                        }
                    }
                }
                prop_assert_eq!(log.is_empty(), model.is_empty());
                prop_assert_eq!(log.bounds(), model.first_key_value().map(|(f, _)| *f).zip(model.last_key_value().map(|(l, _)| *l)));
                for from in [0, start, next.saturating_sub(2)] {
                    prop_assert_eq!(
                        log.from(from).cloned().collect::<Vec<_>>(),
                        model.range(from..).map(|(_, e)| e.clone()).collect::<Vec<_>>()
                    );
                }
            }
        }
    }

    fn entry(sequence: u64) -> LogEntry {
        LogEntry {
            scope: ScopeId::global(),
            origin: "a".into(),
            sequence,
            timestamp: Timestamp::from_u64(sequence),
            mutation: RowMutation::new("t", "k", vec![Mutation::DeleteFromRow], &Limits::default())
                .unwrap(),
        }
    }

    fn row_write(key: &str, row: Option<RowState>) -> RowWrite {
        RowWrite {
            table: "t".into(),
            key: Bytes::copy_from_slice(key.as_bytes()),
            row,
        }
    }

    /// Everything observable through the trait, for comparing two stores.
    fn observe(s: &MemStorage) -> String {
        let (g, a) = (ScopeId::global(), ReplicaId::from("a"));
        format!(
            "{:?} {:?} {:?} {:?} {:?} {:?} {:?}",
            s.rows().collect::<Vec<_>>(),
            s.tables().unwrap(),
            s.read_log(&g, &a, 0, usize::MAX, usize::MAX).unwrap(),
            s.log_bounds(&g, &a).unwrap(),
            s.watermarks().unwrap(),
            s.meta("m").unwrap(),
            s.scan_rows("t", b"k", Some(b"k1"), 10).unwrap(),
        )
    }

    #[test]
    fn crash_keeps_exactly_what_was_synced() {
        let wm = |n| Watermark {
            sequence: n,
            timestamp: Timestamp::from_u64(n),
        };
        let (g, a) = (ScopeId::global(), ReplicaId::from("a"));
        let mut s = MemStorage::new();
        s.write(WriteBatch {
            rows: vec![
                row_write("k1", Some(RowState::default())),
                row_write("k2", Some(RowState::default())),
            ],
            log: (1..=5).map(entry).collect(),
            watermarks: vec![(g.clone(), a.clone(), wm(5))],
            meta: vec![("m".into(), Some(Bytes::from_static(b"1")))],
            ..WriteBatch::default()
        })
        .unwrap();
        s.sync().unwrap();
        let synced = observe(&s);
        // Overwrites, deletions, truncation and new entries, in two batches.
        s.write(WriteBatch {
            rows: vec![
                row_write("k1", None),
                row_write("k3", Some(RowState::default())),
            ],
            log: (6..=8).map(entry).collect(),
            watermarks: vec![(g.clone(), a.clone(), wm(8))],
            truncate_log: vec![(g.clone(), a.clone(), 4)],
            meta: vec![("m".into(), None)],
        })
        .unwrap();
        s.write(WriteBatch {
            rows: vec![row_write("k2", None), row_write("k3", None)],
            truncate_log: vec![(g.clone(), a.clone(), 100)],
            ..WriteBatch::default()
        })
        .unwrap();
        assert_eq!(s.log_bounds(&g, &a).unwrap(), None);
        assert_eq!(s.tables().unwrap(), Vec::<Arc<str>>::new());
        assert_ne!(observe(&s), synced);
        s.crash();
        assert_eq!(observe(&s), synced);
        assert_eq!(s.log_bounds(&g, &a).unwrap(), Some((1, 5)));
        // A synced write survives a crash.
        s.write(WriteBatch {
            truncate_log: vec![(g.clone(), a.clone(), 3)],
            ..WriteBatch::default()
        })
        .unwrap();
        s.sync().unwrap();
        s.crash();
        assert_eq!(s.log_bounds(&g, &a).unwrap(), Some((3, 5)));
    }

    /// `update_row` in place leaves what the trait's default read-modify-write
    /// leaves (a new row, a changed one, an emptied one, an absent one left empty),
    /// with the crash model on or off; with it on, a crash reverts it like a write.
    #[test]
    fn update_row_in_place_matches_read_modify_write() {
        let set = |v: &'static str| {
            vec![Mutation::SetCell {
                family: "f".into(),
                column: Bytes::from_static(b"c"),
                value: Bytes::from_static(v.as_bytes()),
            }]
        };
        // (key, timestamp, mutations, purge: compact at a horizon above everything)
        let steps = [
            ("k1", 1, set("a"), false),
            ("k2", 2, set("b"), false),
            ("k1", 3, set("c"), false),
            ("k2", 4, vec![Mutation::DeleteFromRow], true),
            ("k3", 5, vec![Mutation::DeleteFromRow], true),
        ];
        let table: Arc<str> = "t".into();
        for crash_model in [true, false] {
            let mut fast = MemStorage::new();
            fast.set_crash_model(crash_model);
            let mut plain = MemStorage::new();
            let mut synced = None;
            for (i, (key, ts, muts, purge)) in steps.iter().enumerate() {
                let version = Version::new(Timestamp::from_u64(*ts), "a".into());
                let horizon = if *purge {
                    Timestamp::MAX
                } else {
                    Timestamp::ZERO
                };
                let mut update = |row: &mut RowState| {
                    row.apply(&version, muts, None);
                    row.compact(None, horizon, 0);
                };
                let batch = || WriteBatch {
                    log: vec![entry(*ts)],
                    ..WriteBatch::default()
                };
                let key = Bytes::copy_from_slice(key.as_bytes());
                fast.update_row(&table, &key, &mut update, batch()).unwrap();
                let mut row = plain.get_row("t", &key).unwrap().unwrap_or_default();
                update(&mut row);
                let mut b = batch();
                b.rows.push(RowWrite {
                    table: table.clone(),
                    key,
                    row: (!row.is_empty()).then_some(row),
                });
                plain.write(b).unwrap();
                assert_eq!(observe(&fast), observe(&plain), "after step {i}");
                if i == 1 {
                    fast.sync().unwrap();
                    synced = Some(observe(&fast));
                }
            }
            assert_eq!(fast.row_count(), 1, "k1 is left");
            if crash_model {
                fast.crash();
                assert_eq!(Some(observe(&fast)), synced);
            }
        }
    }

    /// `MemStorage::append_entry` writes straight in what `write` of the batch
    /// would, and a crash takes back the same.
    #[test]
    fn append_entry_is_the_batch_write() {
        let wm = |n: u64| Watermark {
            sequence: n,
            timestamp: Timestamp::from_u64(n * 10),
        };
        for crash_model in [true, false] {
            let mut direct = MemStorage::new();
            direct.set_crash_model(crash_model);
            let mut batched = MemStorage::new();
            batched.set_crash_model(crash_model);
            let mut synced = None;
            for seq in [1, 2, 3, 2, 4] {
                direct.append_entry(&entry(seq), wm(seq)).unwrap();
                batched
                    .write(WriteBatch::of_entry(&entry(seq), wm(seq)))
                    .unwrap();
                assert_eq!(observe(&direct), observe(&batched), "after {seq}");
                if seq == 2 && synced.is_none() {
                    direct.sync().unwrap();
                    batched.sync().unwrap();
                    synced = Some(observe(&direct));
                }
            }
            if crash_model {
                direct.crash();
                batched.crash();
                assert_eq!(observe(&direct), observe(&batched));
                assert_eq!(Some(observe(&direct)), synced);
            }
        }
    }

    /// Key ranges scan forward and back, each end included or not; a range that
    /// ends before it starts is empty, not a panic.
    #[test]
    fn scan_range_honours_bounds_and_direction() {
        let mut s = MemStorage::new();
        let rows = ["a", "b1", "b2", "b3", "c"];
        s.write(WriteBatch {
            rows: rows
                .iter()
                .map(|k| row_write(k, Some(RowState::default())))
                .collect(),
            ..Default::default()
        })
        .unwrap();
        let keys = |range: &BytesRange, reverse: bool, limit: usize| -> Vec<String> {
            s.scan_range("t", range, reverse, limit)
                .unwrap()
                .into_iter()
                .map(|(k, _)| String::from_utf8(k.to_vec()).unwrap())
                .collect()
        };
        let b = |k: &'static str| Bytes::from_static(k.as_bytes());
        assert_eq!(
            keys(&BytesRange::prefix(b"b"), false, 10),
            ["b1", "b2", "b3"]
        );
        assert_eq!(keys(&BytesRange::prefix(b"b"), true, 2), ["b3", "b2"]);
        let r = BytesRange {
            start: Bound::Excluded(b("b1")),
            end: Bound::Included(b("c")),
        };
        assert_eq!(keys(&r, false, 10), ["b2", "b3", "c"]);
        assert_eq!(keys(&r, true, 10), ["c", "b3", "b2"]);
        let backwards = BytesRange {
            start: Bound::Excluded(b("c")),
            end: Bound::Excluded(b("c")),
        };
        assert!(keys(&backwards, false, 10).is_empty());
        assert!(keys(&BytesRange::ALL, true, 10).len() == 5);
        assert!(
            s.scan_range("none", &BytesRange::ALL, false, 9)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    #[should_panic(expected = "crash model off")]
    fn crash_with_the_crash_model_off_is_a_bug() {
        let mut s = MemStorage::new();
        s.set_crash_model(false);
        s.crash();
    }
}
