//! Rows shared between the in-memory stores of one process (the simulator's
//! replicas): a replica applying a log entry to a row that another replica already
//! turned into the next row takes that row instead of computing and storing its own.
//!
//! Every replica applies every write of its scope, and the change is a function of
//! the row before and the entry ([`RowApply::change`]). Where replicas hold the very
//! same row (one `Arc`, not merely equal contents), the first to apply an entry
//! computes the next row and records it here under (row, entry); the others find it.
//! Compaction is shared the same way, keyed on the row and its purge cut
//! ([`RowState::purge_cut`]): replicas whose horizons differ but purge the same
//! tombstones get the same row. A simulated deployment of 27 replicas then holds
//! most rows once instead of 27 times and applies most entries by a lookup.
//!
//! Exact: a hit returns what computing would have returned. A record holds the row,
//! entry and deployment its key names by address, so no address is reused while it
//! exists. Bounded: the oldest records go first. Replicas that received two writes
//! to one row in different orders hold different `Arc`s with equal contents, and
//! their next changes miss each other's records; each row computed is therefore
//! compared with the last one computed for the same row key and, if equal, replaced
//! by it, so that such replicas share again from then on.

use bytes::Bytes;
use pangea_core::hash::WordHasher;
use pangea_core::storage::RowSharing;
use pangea_core::{Compaction, ReplicaId, RowApply, RowMutation, RowState, Timestamp};
use pangea_topology::Deployment;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex, PoisonError};

/// Records kept: the applies of about 16 s of writes at the reference run's 250
/// writes a second (an entry reaches every replica within a second unless a fault
/// holds it back). A bound on the count, not the bytes: each record keeps its rows
/// (and their values) alive, so with values near the 1 MB limit written fast the
/// records can hold superseded rows worth some seconds of writes. 16,384 held the
/// reference run at 344 MiB instead of 264 and took 2 % more time.
const RECORDS_MAX: usize = 4_096;

/// The shared records (stores hold it in an `Arc`). See the module documentation.
#[derive(Debug, Default)]
pub struct SharedRows(Mutex<Records>);

/// What a record is the result of, by address (0: no row yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    /// A log entry's change: its mutations and version.
    Apply {
        row: usize,
        mutations: usize,
        timestamp: Timestamp,
        origin: usize,
        deployment: usize,
    },
    /// Compaction that purges the tombstones up to `cut`.
    Compact {
        row: usize,
        cut: Option<Timestamp>,
        deployment: usize,
    },
}

#[derive(Debug)]
struct Record {
    next: Arc<RowState>,
    /// The row's (table, key), to forget `Records::latest` with the record.
    row_key: RowKey,
    /// Held so that the key's addresses stay theirs.
    _held: Held,
}

#[derive(Debug)]
struct Held {
    _row: Option<Arc<RowState>>,
    _entry: Option<(RowMutation, ReplicaId)>,
    _deployment: Arc<Deployment>,
}

type RowKey = (Arc<str>, Bytes);

/// The maps hash a word at a time ([`WordHasher`]), not with SipHash (a
/// hash-flooding defence): only the simulator's in-memory stores share rows,
/// never a serving node's, and its own workload makes the keys. They are only
/// looked up, never iterated, so no order reaches an output.
#[derive(Debug, Default)]
struct Records {
    by_key: HashMap<Key, Record, Words>,
    /// Insertion order, for dropping the oldest.
    order: VecDeque<Key>,
    /// The last row computed for each (table, row key). A row computed again and
    /// equal to it is replaced by it: replicas whose rows parted (two writes
    /// applied in different orders) hold one row again once their contents agree.
    latest: HashMap<RowKey, Arc<RowState>, Words>,
    hits: u64,
    misses: u64,
}

type Words = BuildHasherDefault<WordHasher>;

fn address(row: Option<&Arc<RowState>>) -> usize {
    row.map_or(0, |r| Arc::as_ptr(r) as usize)
}

impl Records {
    fn find(&mut self, key: &Key) -> Option<Arc<RowState>> {
        let next = self.by_key.get(key).map(|r| r.next.clone());
        match next {
            Some(_) => self.hits += 1,
            None => self.misses += 1,
        }
        next
    }

    /// `row`, computed for (`table`, `key`), as one `Arc`: the last row computed
    /// for that key if equal, else a new one, which becomes the last.
    fn canonical(&mut self, table: &Arc<str>, key: &Bytes, row: RowState) -> Arc<RowState> {
        let row_key = (table.clone(), key.clone());
        if let Some(last) = self.latest.get(&row_key)
            && **last == row
        {
            return last.clone();
        }
        let row = Arc::new(row);
        self.latest.insert(row_key, row.clone());
        row
    }

    fn record(
        &mut self,
        key: Key,
        next: &Arc<RowState>,
        (table, row_key): (&Arc<str>, &Bytes),
        held: Held,
    ) {
        let record = Record {
            next: next.clone(),
            row_key: (table.clone(), row_key.clone()),
            _held: held,
        };
        if self.order.len() >= RECORDS_MAX
            && let Some(oldest) = self.order.pop_front()
            && let Some(old) = self.by_key.remove(&oldest)
            && self
                .latest
                .get(&old.row_key)
                .is_some_and(|last| Arc::ptr_eq(last, &old.next))
        {
            self.latest.remove(&old.row_key);
        }
        self.order.push_back(key);
        self.by_key.insert(key, record);
    }
}

impl SharedRows {
    pub fn new() -> Self {
        Self::default()
    }

    /// (hits, misses): results found here, and results computed.
    pub fn stats(&self) -> (u64, u64) {
        let r = self.records();
        (r.hits, r.misses)
    }

    fn records(&self) -> std::sync::MutexGuard<'_, Records> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl RowSharing for SharedRows {
    /// [`RowApply::change`] applied to `row` (`None`: no row yet), shared.
    fn apply(&self, row: Option<&Arc<RowState>>, a: &RowApply<'_>) -> Arc<RowState> {
        let e = a.entry;
        let deployment = a.compaction.deployment;
        let key = Key::Apply {
            row: address(row),
            mutations: e.mutation.mutations().as_ptr() as usize,
            timestamp: e.timestamp,
            origin: e.origin.as_str().as_ptr() as usize,
            deployment: Arc::as_ptr(deployment) as usize,
        };
        let mut records = self.records();
        if let Some(next) = records.find(&key) {
            return next;
        }
        let mut next = row.map(|r| RowState::clone(r)).unwrap_or_default();
        a.change(&mut next);
        let (table, row_key) = (e.mutation.table(), e.mutation.row_key());
        let next = records.canonical(table, row_key, next);
        let held = Held {
            _row: row.cloned(),
            _entry: Some((e.mutation.clone(), e.origin.clone())),
            _deployment: deployment.clone(),
        };
        records.record(key, &next, (table, row_key), held);
        next
    }

    /// `row` compacted by `c` if that changes it, shared when the result depends on
    /// the horizon only through the row's purge cut (no TTL in play).
    fn compact(
        &self,
        row: Arc<RowState>,
        (table, row_key): (&Arc<str>, &Bytes),
        c: &Compaction<'_>,
    ) -> Arc<RowState> {
        if !c.needs(table, &row) {
            return row;
        }
        let Some(cut) = row.purge_cut(c.schema(table), c.horizon, c.now_ms) else {
            let mut row = row;
            c.run(table, Arc::make_mut(&mut row));
            return row;
        };
        let key = Key::Compact {
            row: address(Some(&row)),
            cut,
            deployment: Arc::as_ptr(c.deployment) as usize,
        };
        let mut records = self.records();
        if let Some(next) = records.find(&key) {
            return next;
        }
        let mut next = RowState::clone(&row);
        c.run(table, &mut next);
        let next = records.canonical(table, row_key, next);
        let held = Held {
            _row: Some(row),
            _entry: None,
            _deployment: c.deployment.clone(),
        };
        records.record(key, &next, (table, row_key), held);
        next
    }
}
