//! `pangea-store`: a replica's durable state on [fjall], an embedded LSM tree.
//!
//! [`Store`] implements `pangea_core::Storage`: rows, the replication log per (scope,
//! origin) and applied watermarks live in three fjall keyspaces of one database, so a
//! `WriteBatch` (row change + log entry + watermark) is one atomic fjall batch and a
//! crash never separates them (docs/invariants.md, I2).
//!
//! Durability: by default a write counts as durable only once the journal is fsynced
//! ([`Durability::Fsync`]). [`Store::commit_durable`] implements group commit for
//! concurrent writers: each commits its batch to the journal, then one of them
//! fsyncs for everyone who committed before it started.
//!
//! Point reads go through a cache of decoded rows (`row_cache`), brought up to date
//! by every commit before it returns; [`Store::cached_row`] answers from it alone,
//! so a server can keep fjall's reads (which may block) off its serving threads.
//!
//! Modules: `keys` (the key layout), `group_commit`, `row_cache`.

mod group_commit;
mod keys;
mod row_cache;

pub use row_cache::CachedRow;

use bytes::Bytes;
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use pangea_core::storage::{LogEntry, Storage, Watermark, WriteBatch};
use pangea_core::{BytesRange, Limits, ReplicaId, RowState, ScopeId, StorageError, Timestamp};
use pangea_proto::Message;
use pangea_proto::v1 as pb;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use group_commit::GroupCommit;

/// Errors of this crate. Engine failures keep fjall's error as their source;
/// damaged entries name the keyspace entry.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create the store directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the store at {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: fjall::Error,
    },
    #[error("cannot open keyspace {name:?} of the store at {path}")]
    Keyspace {
        path: PathBuf,
        name: &'static str,
        #[source]
        source: fjall::Error,
    },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// fjall's error `e`, met while `doing` something, as the core sees it.
fn io(doing: &'static str) -> impl FnOnce(fjall::Error) -> StorageError {
    move |e| StorageError::Io {
        doing,
        source: pangea_core::EngineError::new(e),
    }
}

/// Per stream, a sequence below which the log holds no entry: where the last
/// purge ended. Log scans start there, so the tombstones purges leave behind
/// (kept by the LSM tree until compaction reaches the last level) are not
/// stepped over again by every purge and every bounds lookup — which, with a
/// purge per stream every few heartbeats, made a replica's apply thread slower
/// with every minute of writes. Not persisted: after a restart a stream's first
/// purge scans from 0, once.
#[derive(Default)]
struct LogFloors(std::sync::Mutex<HashMap<(ScopeId, ReplicaId), u64>>);

impl LogFloors {
    fn get(&self, scope: &ScopeId, origin: &ReplicaId) -> u64 {
        let floors = self.0.lock().unwrap_or_else(|p| p.into_inner());
        floors
            .get(&(scope.clone(), origin.clone()))
            .copied()
            .unwrap_or(0)
    }

    /// After a commit: purges raise their stream's floor to where they ended,
    /// entries appended below a floor (a log rebuilt after a snapshot) bring it
    /// down to them.
    fn moved(&self, purged: Vec<(ScopeId, ReplicaId, u64)>, appended: &[LogEntry]) {
        let mut floors = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for (scope, origin, below) in purged {
            let floor = floors.entry((scope, origin)).or_insert(0);
            *floor = (*floor).max(below);
        }
        if floors.is_empty() {
            return;
        }
        for e in appended {
            if let Some(floor) = floors.get_mut(&(e.scope.clone(), e.origin.clone())) {
                *floor = (*floor).min(e.sequence);
            }
        }
    }
}

/// When a write counts as durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `sync` fsyncs the journal (fdatasync): acknowledged writes survive `kill -9`
    /// and power loss. The default.
    #[default]
    Fsync,
    /// `sync` only hands the journal to the OS: survives `kill -9` of the process,
    /// not a machine crash. For benchmarks and throwaway clusters.
    OsBuffer,
}

/// Tuning of a [`Store`]; the defaults suit one replica of the reference deployment.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub durability: Durability,
    /// Block cache size in bytes (default 64 MiB).
    pub cache_bytes: u64,
    /// Row cache for point reads (decoded rows and their encoded answers), in bytes,
    /// each row counted at twice its stored size (default 64 MiB; 0 turns it off).
    pub row_cache_bytes: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            durability: Durability::Fsync,
            cache_bytes: 64 << 20,
            row_cache_bytes: 64 << 20,
        }
    }
}

/// A replica's durable state. Cheap to clone: clones share the database, so a
/// serving task can read while the replication core writes.
#[derive(Clone)]
pub struct Store {
    db: Database,
    rows: Keyspace,
    log: Keyspace,
    meta: Keyspace,
    options: StoreOptions,
    path: Arc<Path>,
    group: Arc<GroupCommit>,
    row_cache: Option<Arc<row_cache::RowCache>>,
    /// Where each stream's retained log starts, as far as this process knows.
    log_floors: Arc<LogFloors>,
    /// This handle wrote since its last [`Storage::sync`], which therefore has work
    /// to do (a driver turn that wrote nothing then costs no fsync).
    unsynced: bool,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .field("options", &self.options)
            .finish()
    }
}

impl Store {
    /// Opens (or creates) the store in directory `path`, recovering from the journal
    /// after a crash.
    pub fn open(path: impl AsRef<Path>, options: StoreOptions) -> Result<Store, Error> {
        let path = path.as_ref();
        std::fs::create_dir_all(path).map_err(|source| Error::CreateDir {
            path: path.to_owned(),
            source,
        })?;
        let db = Database::builder(path)
            .cache_size(options.cache_bytes)
            // We decide when to fsync (group commit), not fjall.
            .manual_journal_persist(true)
            .open()
            .map_err(|source| Error::Open {
                path: path.to_owned(),
                source,
            })?;
        let keyspace = |name: &'static str| {
            db.keyspace(name, KeyspaceCreateOptions::default)
                .map_err(|source| Error::Keyspace {
                    path: path.to_owned(),
                    name,
                    source,
                })
        };
        let (rows, log, meta) = (keyspace("rows")?, keyspace("log")?, keyspace("meta")?);
        let persist = match options.durability {
            Durability::Fsync => PersistMode::SyncData,
            Durability::OsBuffer => PersistMode::Buffer,
        };
        Ok(Store {
            group: Arc::new(GroupCommit::new(db.clone(), persist)),
            row_cache: row_cache::RowCache::new(options.row_cache_bytes).map(Arc::new),
            log_floors: Arc::default(),
            db,
            rows,
            log,
            meta,
            options,
            path: path.into(),
            unsynced: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Fsyncs performed so far, by every handle of this store.
    pub fn syncs(&self) -> u64 {
        self.group.syncs()
    }

    /// Writes `batch` and returns once it is durable; many threads calling this share
    /// one fsync (group commit).
    pub fn commit_durable(&self, batch: WriteBatch) -> Result<(), StorageError> {
        self.commit(batch)?;
        self.group.sync_after_commit()
    }

    fn commit(&self, batch: WriteBatch) -> Result<(), StorageError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut b = self.db.batch();
        // Each row written, with its new state and stored size (for the row cache).
        let mut written = Vec::with_capacity(batch.rows.len());
        for w in batch.rows {
            let key = keys::row_key(&w.table, &w.key);
            match w.row {
                Some(row) if !row.is_empty() => {
                    let stored = encode_row(&row);
                    // A cached row takes its new state decoded from what is stored,
                    // not `row` itself: its values may be slices of the frame (or
                    // the packet buffer) they arrived in, which the cache must not
                    // keep alive beyond the bytes it counts.
                    let fresh = self
                        .row_cache
                        .as_ref()
                        .filter(|c| c.contains(&key))
                        .and_then(|_| decode_row(&key, &stored).ok())
                        .map(|r| (Arc::new(CachedRow::new(r)), stored.len()));
                    b.insert(&self.rows, key.clone(), stored);
                    written.push((key, fresh));
                }
                _ => {
                    b.remove(&self.rows, key.clone());
                    written.push((key, None));
                }
            }
        }
        for e in &batch.log {
            let key = keys::log_key(e.scope.as_str(), e.origin.as_str(), e.sequence);
            b.insert(&self.log, key, encode(&e.to_frame()));
        }
        for (scope, origin, wm) in &batch.watermarks {
            let mut v = Vec::with_capacity(16);
            v.extend_from_slice(&wm.sequence.to_be_bytes());
            v.extend_from_slice(&wm.timestamp.as_u64().to_be_bytes());
            b.insert(
                &self.meta,
                keys::watermark_key(scope.as_str(), origin.as_str()),
                v,
            );
        }
        let mut purged = Vec::with_capacity(batch.truncate_log.len());
        for (scope, origin, below) in &batch.truncate_log {
            // From the floor, not from 0: below it lie only the tombstones of
            // earlier purges, which every scan from 0 would step over again.
            let floor = self.log_floors.get(scope, origin);
            if floor >= *below {
                continue;
            }
            let start = keys::log_key(scope.as_str(), origin.as_str(), floor);
            let end = keys::log_key(scope.as_str(), origin.as_str(), *below);
            for kv in self.log.range(start..end) {
                b.remove(&self.log, kv.key().map_err(io("purging the log"))?);
            }
            purged.push((scope.clone(), origin.clone(), *below));
        }
        for (name, value) in batch.meta {
            match value {
                Some(v) => b.insert(&self.meta, keys::meta_key(&name), v.to_vec()),
                None => b.remove(&self.meta, keys::meta_key(&name)),
            }
        }
        let committed = b.commit().map_err(io("committing a batch"));
        if committed.is_ok() {
            self.log_floors.moved(purged, &batch.log);
        }
        // Before returning, so before anyone can learn of this commit (row_cache).
        // A cached row takes its new state at once: a hot row that is written
        // stays a cache hit, and reads of it do not go to fjall.
        if let Some(cache) = &self.row_cache {
            for (key, fresh) in written {
                cache.replace(&key, fresh.filter(|_| committed.is_ok()));
            }
        }
        committed
    }

    /// Every stream (scope, origin) the store knows, by watermark or by retained
    /// log, in order (`pangea store inspect`).
    pub fn stream_stats(&self) -> Result<Vec<StreamStats>, StorageError> {
        let mut streams = std::collections::BTreeMap::new();
        for (scope, origin, wm) in self.watermarks()? {
            let s = streams
                .entry((scope.clone(), origin.clone()))
                .or_insert_with(|| StreamStats::new(scope, origin));
            s.watermark = Some(wm);
        }
        for (scope, origin, first, last) in self.log_streams()? {
            let s = streams
                .entry((scope.clone(), origin.clone()))
                .or_insert_with(|| StreamStats::new(scope, origin));
            s.log = Some((first, last));
        }
        Ok(streams.into_values().collect())
    }

    /// Every (scope, origin) with a retained log, with its first and last sequence.
    fn log_streams(&self) -> Result<Vec<(ScopeId, ReplicaId, u64, u64)>, StorageError> {
        let mut out = Vec::new();
        let mut from: Vec<u8> = Vec::new();
        // Skip-scan: read the first key of a stream, its last key, then jump past it.
        loop {
            let Some(first) = self.log.range(from.clone()..).next() else {
                break;
            };
            let k = first.key().map_err(io("listing the log's streams"))?;
            let (scope, origin, first_seq) = split_log(&k)?;
            let prefix = keys::log_prefix(&scope, &origin);
            let last = self
                .log
                .prefix(&prefix)
                .next_back()
                .map(|g| g.key())
                .transpose()
                .map_err(io("listing the log's streams"))?;
            let last_seq = last
                .as_deref()
                .map(split_log)
                .transpose()?
                .map_or(first_seq, |l| l.2);
            out.push((
                scope.as_str().into(),
                origin.as_str().into(),
                first_seq,
                last_seq,
            ));
            from = keys::log_key(&scope, &origin, u64::MAX);
            from.push(0);
        }
        Ok(out)
    }

    /// Row count, key and value bytes of every table (a full scan).
    pub fn table_stats(&self) -> Result<Vec<TableStats>, StorageError> {
        let mut out: Vec<TableStats> = Vec::new();
        for kv in self.rows.iter() {
            let (k, v) = kv.into_inner().map_err(io("counting table sizes"))?;
            let (table, _) = keys::split_row_key(&k)
                .ok_or_else(|| corrupt("row key", &k, "no table separator"))?;
            match out.last_mut() {
                Some(t) if &*t.table == table => {}
                _ => out.push(TableStats {
                    table: table.into(),
                    ..Default::default()
                }),
            }
            let t = out.last_mut().expect("pushed above");
            t.rows += 1;
            t.key_bytes += k.len() as u64;
            t.value_bytes += v.len() as u64;
        }
        Ok(out)
    }

    /// Bytes on disk (journal and tables).
    pub fn disk_bytes(&self) -> Result<u64, StorageError> {
        self.db.disk_space().map_err(io("measuring its disk space"))
    }
}

/// One line of `pangea store inspect`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableStats {
    pub table: Arc<str>,
    pub rows: u64,
    pub key_bytes: u64,
    pub value_bytes: u64,
}

/// One stream of `pangea store inspect`: how far it is applied, what log is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStats {
    pub scope: ScopeId,
    pub origin: ReplicaId,
    pub watermark: Option<Watermark>,
    /// First and last sequence of the retained log.
    pub log: Option<(u64, u64)>,
}

impl StreamStats {
    fn new(scope: ScopeId, origin: ReplicaId) -> StreamStats {
        StreamStats {
            scope,
            origin,
            watermark: None,
            log: None,
        }
    }
}

fn encode(m: &impl Message) -> Vec<u8> {
    let mut v = Vec::with_capacity(1 + m.encoded_len());
    v.push(keys::FORMAT_V1);
    m.encode(&mut v).expect("Vec grows as needed");
    v
}

fn encode_row(row: &RowState) -> Vec<u8> {
    // The key is already in the fjall key.
    encode(&row.to_proto(&Bytes::new()))
}

/// A damaged entry, named without user data: a row's key shows as its table and the
/// redacted row key (`pangea_core::redact`), since this message reaches logs and
/// clients; log keys (scope, origin, sequence) are shown as they are.
fn corrupt(what: &'static str, key: &[u8], detail: impl std::fmt::Display) -> StorageError {
    let key = match keys::split_row_key(key) {
        Some((table, row)) if what.starts_with("row") => {
            format!("{table}/{}", pangea_core::redact::RedactedKey(row))
        }
        Some(_) if what.starts_with("log") => keys::printable(key),
        _ => pangea_core::redact::RedactedKey(key).to_string(),
    };
    StorageError::Corrupt {
        what,
        key,
        detail: detail.to_string(),
    }
}

fn body<'a>(what: &'static str, key: &[u8], v: &'a [u8]) -> Result<&'a [u8], StorageError> {
    match v.split_first() {
        Some((&keys::FORMAT_V1, body)) => Ok(body),
        Some((f, _)) => Err(corrupt(what, key, format!("unknown format byte {f}"))),
        None => Err(corrupt(what, key, "empty value")),
    }
}

fn decode_row(key: &[u8], v: &[u8]) -> Result<RowState, StorageError> {
    let p = pb::RowState::decode(body("row", key, v)?).map_err(|e| corrupt("row", key, e))?;
    RowState::from_proto(p)
        .map(|(_, row)| row)
        .map_err(|e| corrupt("row", key, e))
}

fn split_log(k: &[u8]) -> Result<(String, String, u64), StorageError> {
    keys::split_log_key(k)
        .map(|(s, o, q)| (s.to_owned(), o.to_owned(), q))
        .ok_or_else(|| corrupt("log key", k, "not scope\\0origin\\0sequence"))
}

impl Store {
    /// [`Storage::get_row`] for readers that only look at the row: a row cache hit
    /// shares the cached row (and its encoded answer, [`CachedRow::latest_encoded`])
    /// instead of copying it.
    pub fn get_row_shared(
        &self,
        table: &str,
        key: &[u8],
    ) -> Result<Option<Arc<CachedRow>>, StorageError> {
        match self.cached_row(table, key) {
            Ok(row) => Ok(Some(row)),
            Err(miss) => self.read_missed_row(miss),
        }
    }

    /// The row of `key` if the row cache has it, without touching fjall (never
    /// blocks on it), or the ticket for [`Store::read_missed_row`]. A serving
    /// thread answers hits itself and hands misses to a thread that may block:
    /// fjall holds its version lock across file syncs and deletions while it
    /// installs a flush or a compaction, and a read meanwhile waits for them.
    pub fn cached_row(&self, table: &str, key: &[u8]) -> Result<Arc<CachedRow>, RowMiss> {
        let key = keys::row_key(table, key);
        match &self.row_cache {
            None => Err(RowMiss { key, ticket: None }),
            Some(cache) => cache.lookup(&key).map_err(|ticket| RowMiss {
                key,
                ticket: Some(ticket),
            }),
        }
    }

    /// Reads a row the cache missed from fjall (may block), and caches it unless
    /// a write to its part of the cache came in meanwhile.
    pub fn read_missed_row(&self, miss: RowMiss) -> Result<Option<Arc<CachedRow>>, StorageError> {
        let RowMiss { key, ticket } = miss;
        let Some(v) = self.rows.get(&key).map_err(io("reading a row"))? else {
            return Ok(None);
        };
        let row = Arc::new(CachedRow::new(decode_row(&key, &v)?));
        if let (Some(cache), Some(ticket)) = (&self.row_cache, ticket) {
            cache.fill(&key, ticket, &row, v.len());
        }
        Ok(Some(row))
    }
}

/// A point read the row cache could not answer ([`Store::cached_row`]).
pub struct RowMiss {
    key: Vec<u8>,
    ticket: Option<row_cache::Miss>,
}

impl std::fmt::Debug for RowMiss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Row keys stay out of logs (pangea_core::redact).
        f.debug_struct("RowMiss")
            .field("key_bytes", &self.key.len())
            .finish_non_exhaustive()
    }
}

impl Storage for Store {
    fn get_row(&self, table: &str, key: &[u8]) -> Result<Option<RowState>, StorageError> {
        Ok(self.get_row_shared(table, key)?.map(CachedRow::into_row))
    }

    fn scan_range(
        &self,
        table: &str,
        range: &BytesRange,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<(Bytes, RowState)>, StorageError> {
        use std::ops::Bound;
        if range.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        // A table's rows are the keys "table\0row": the unbounded ends are the
        // table's first and last.
        let full = |b: &Bound<Bytes>| b.as_ref().map(|k| keys::row_key(table, k));
        let start = match full(&range.start) {
            Bound::Unbounded => Bound::Included(keys::row_key(table, b"")),
            b => b,
        };
        let end = match full(&range.end) {
            Bound::Unbounded => {
                let mut after = table.as_bytes().to_vec();
                after.push(1);
                Bound::Excluded(after)
            }
            b => b,
        };
        let iter = self.rows.range::<Vec<u8>, _>((start, end));
        let mut out = Vec::new();
        let mut take = |kv: fjall::Guard| -> Result<(), StorageError> {
            let (k, v) = kv.into_inner().map_err(io("scanning rows"))?;
            let row = decode_row(&k, &v)?;
            out.push((Bytes::copy_from_slice(&k[table.len() + 1..]), row));
            Ok(())
        };
        if reverse {
            for kv in iter.rev().take(limit) {
                take(kv)?;
            }
        } else {
            for kv in iter.take(limit) {
                take(kv)?;
            }
        }
        Ok(out)
    }

    fn tables(&self) -> Result<Vec<Arc<str>>, StorageError> {
        let mut out: Vec<Arc<str>> = Vec::new();
        let mut from: Vec<u8> = Vec::new();
        while let Some(kv) = self.rows.range(from.clone()..).next() {
            let k = kv.key().map_err(io("listing tables"))?;
            let (table, _) = keys::split_row_key(&k)
                .ok_or_else(|| corrupt("row key", &k, "no table separator"))?;
            out.push(table.into());
            // The next table starts after every "table\0..." key.
            from = table.as_bytes().to_vec();
            from.push(1);
        }
        Ok(out)
    }

    fn write(&mut self, batch: WriteBatch) -> Result<(), StorageError> {
        // Set first: a write that fails halfway may still have reached the journal.
        self.unsynced |= !batch.is_empty();
        self.commit(batch)
    }

    /// Fsyncs (shared with other writers: group commit) what this handle wrote;
    /// nothing to do when it wrote nothing since its last sync.
    fn sync(&mut self) -> Result<(), StorageError> {
        if !self.unsynced {
            return Ok(());
        }
        self.group.sync_after_commit()?;
        self.unsynced = false;
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
        // Nothing lies below the floor but purged entries' tombstones.
        let from = from.max(self.log_floors.get(scope, origin));
        let start = keys::log_key(scope.as_str(), origin.as_str(), from);
        let end = keys::log_key(scope.as_str(), origin.as_str(), u64::MAX);
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for kv in self.log.range(start..=end).take(max_entries) {
            let (k, v) = kv.into_inner().map_err(io("reading the log"))?;
            let frame = pb::MutationFrame::decode(body("log entry", &k, &v)?)
                .map_err(|e| corrupt("log entry", &k, e))?;
            let entry = LogEntry::from_frame(frame, &Limits::STORED)
                .map_err(|e| corrupt("log entry", &k, e))?;
            bytes = bytes.saturating_add(entry.wire_bytes());
            if !out.is_empty() && bytes > max_bytes {
                break;
            }
            out.push(entry);
        }
        Ok(out)
    }

    fn log_bounds(
        &self,
        scope: &ScopeId,
        origin: &ReplicaId,
    ) -> Result<Option<(u64, u64)>, StorageError> {
        let floor = self.log_floors.get(scope, origin);
        let start = keys::log_key(scope.as_str(), origin.as_str(), floor);
        let end = keys::log_key(scope.as_str(), origin.as_str(), u64::MAX);
        let mut iter = self.log.range(start..=end);
        let first = iter
            .next()
            .map(|g| g.key())
            .transpose()
            .map_err(io("reading the log's bounds"))?;
        let Some(first) = first else { return Ok(None) };
        let last = iter
            .next_back()
            .map(|g| g.key())
            .transpose()
            .map_err(io("reading the log's bounds"))?;
        let first_seq = split_log(&first)?.2;
        let last_seq = last
            .as_deref()
            .map(split_log)
            .transpose()?
            .map_or(first_seq, |l| l.2);
        Ok(Some((first_seq, last_seq)))
    }

    fn watermarks(&self) -> Result<Vec<(ScopeId, ReplicaId, Watermark)>, StorageError> {
        let mut out = Vec::new();
        for kv in self.meta.prefix(keys::WATERMARK_PREFIX) {
            let (k, v) = kv.into_inner().map_err(io("reading watermarks"))?;
            let names = &k[keys::WATERMARK_PREFIX.len()..];
            let nul = names
                .iter()
                .position(|&b| b == 0)
                .ok_or_else(|| corrupt("watermark key", &k, "no separator"))?;
            let (scope, origin) = (
                std::str::from_utf8(&names[..nul]),
                std::str::from_utf8(&names[nul + 1..]),
            );
            let (Ok(scope), Ok(origin), Ok(bytes)) = (scope, origin, <[u8; 16]>::try_from(&v[..]))
            else {
                return Err(corrupt("watermark", &k, "not UTF-8 names and 16 bytes"));
            };
            let (seq, ts) = bytes.split_at(8);
            out.push((
                scope.into(),
                origin.into(),
                Watermark {
                    sequence: u64::from_be_bytes(seq.try_into().expect("split at 8 of 16")),
                    timestamp: Timestamp::from_u64(u64::from_be_bytes(
                        ts.try_into().expect("split at 8 of 16"),
                    )),
                },
            ));
        }
        Ok(out)
    }

    fn meta(&self, key: &str) -> Result<Option<Bytes>, StorageError> {
        Ok(self
            .meta
            .get(keys::meta_key(key))
            .map_err(io("reading metadata"))?
            .map(|v| Bytes::copy_from_slice(&v)))
    }
}
