//! `pangea backup restore`: the rows of a backup chain (a full backup and the
//! incrementals after it), optionally as of a time with the cluster's change
//! log past the chain's cut, written into a cluster through the ordinary write
//! path, so that they replicate and obey placement like any write.
//!
//! Each row is rebuilt as the replica held it (every version the backup has)
//! with the changes up to the time asked merged into it (`RowState`'s CRDT
//! merge: a change the row already held changes nothing), then written:
//! - [`Mode::Merge`]: as a `MergeRow` of those versions (a loader's request):
//!   a version the cluster holds that is newer wins. For a new or emptied
//!   cluster, or a lost table or prefix: it fills what is missing and undoes
//!   nothing written since.
//! - [`Mode::Replace`]: as a write made now that deletes the row and sets the
//!   newest version of each column as of the time (a counter: one increment
//!   of its sum), so the restored state wins over everything before it; rows
//!   under the table and prefix that did not exist then are deleted. This
//!   undoes a bad batch job. History (older versions) is not rewritten, and a
//!   TTL counts from the restore.

use super::create::{candidates, now_ms};
use super::{FileKind, Kind, Manifest, RecordReader, cursor_at, verify_file};
use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use pangea_client::{ChangesFrom, Client, ScanOptions, WriteOptions};
use pangea_core::changes::{Change, Cursor};
use pangea_core::{
    Limits, Mutation, ReadFilter, ReplicaId, RowMutation, RowState, ScopeId, Timestamp, Version,
};
use pangea_proto::v1 as pb;
use pangea_topology::Deployment;
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How restored rows are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Merged with their versions: newer versions in the cluster win.
    Merge,
    /// Written now: the restored state wins; rows that did not exist are deleted.
    Replace,
}

/// What to restore, and how.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// The last backup of the chain (its parents are found through its manifest).
    pub from: PathBuf,
    /// The wall time (Unix ms) to restore the rows as of. `None`: the chain's cut.
    /// Later than the chain's cut, the changes in between are read from the
    /// cluster's change log (the tables' `changes.retention` must reach back).
    pub as_of_ms: Option<u64>,
    /// Only this table (`None`: every table of the backup).
    pub table: Option<String>,
    /// Only rows whose key starts with this.
    pub prefix: Bytes,
    pub mode: Mode,
    /// Deadline of each call.
    pub deadline: Duration,
    /// Rows per batch write.
    pub batch_rows: usize,
}

/// What a restore did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RestoreReport {
    /// The backups used, oldest first.
    pub chain: Vec<String>,
    pub cut_ms: u64,
    pub as_of_ms: Option<u64>,
    /// Changes merged from the backups' tails and incrementals.
    pub changes_from_backups: u64,
    /// Changes merged from the cluster's log past the chain.
    pub changes_from_log: u64,
    pub rows_written: u64,
    /// Rows deleted: gone as of the time ([`Mode::Replace`]).
    pub rows_deleted: u64,
    /// Rows not written, each reported through `progress`.
    pub rows_failed: u64,
    pub seconds: f64,
}

/// A change to merge, and whether its increments are already in the row
/// (a full backup's tail: a counter is read as one sum, so its increments
/// cannot be told apart; they are left out).
type Pending = Vec<(Change, bool)>;

/// Restores `o.from` into the cluster `client` writes to.
pub async fn restore(
    client: &Client,
    o: &RestoreOptions,
    progress: &mut (dyn FnMut(String) + Send),
) -> Result<RestoreReport> {
    let began = Instant::now();
    let d = client.deployment();
    let chain = chain_of(&o.from)?;
    let (base_dir, base) = &chain[0];
    let last = &chain[chain.len() - 1].1;
    let cut_ms = base.cut_ms();
    if let Some(t) = o.as_of_ms {
        ensure!(
            t >= cut_ms,
            "--as-of {t} is before the full backup's cut ({cut_ms}, {}): restore from an \
             older backup",
            base_dir.display()
        );
    }
    if let Some(t) = &o.table {
        ensure!(
            base.tables.contains(t),
            "--table {t:?}: the backup has tables {}",
            base.tables.join(", ")
        );
    }
    for (dir, m) in &chain {
        for f in m.scopes.iter().flat_map(|s| &s.files) {
            verify_file(dir, f)?;
        }
    }
    progress(format!(
        "{} backup(s) verified, cut at {cut_ms} ms; as of {}",
        chain.len(),
        o.as_of_ms
            .map_or("the cut".to_owned(), |t| format!("{t} ms"))
    ));
    let mut report = RestoreReport {
        chain: chain.iter().map(|(d, _)| d.display().to_string()).collect(),
        cut_ms,
        as_of_ms: o.as_of_ms,
        ..RestoreReport::default()
    };
    let wanted_table = |t: &str| o.table.as_deref().is_none_or(|w| w == t);
    let until = o
        .as_of_ms
        .map_or(Timestamp::MAX, |t| Timestamp::new(t, u16::MAX));
    let mut pending: HashMap<(String, Bytes), Pending> = HashMap::new();
    let keep = |c: Change, counted: bool, pending: &mut HashMap<(String, Bytes), Pending>| {
        let m = &c.mutation;
        if !wanted_table(m.table()) || !m.row_key().starts_with(&o.prefix) || c.timestamp > until {
            return false;
        }
        pending
            .entry((m.table().to_string(), m.row_key().clone()))
            .or_default()
            .push((c, counted));
        true
    };
    let limits = Limits::default();
    for (dir, m) in &chain {
        for f in m.scopes.iter().flat_map(|s| &s.files) {
            if f.kind != FileKind::Changes || !wanted_table(&f.table) {
                continue;
            }
            for rec in RecordReader::<pb::Change>::open(dir, f)? {
                let c = Change::from_proto(rec?, &limits)
                    .with_context(|| format!("{}: a change", f.path))?;
                if keep(c, m.kind == Kind::Full, &mut pending) {
                    report.changes_from_backups += 1;
                }
            }
        }
    }
    if o.as_of_ms.is_some_and(|t| t > last.cut_ms()) {
        let n = read_log(client, &d, last, o, &mut |c| keep(c, false, &mut pending)).await?;
        report.changes_from_log = n;
        progress(format!(
            "{n} changes read from the cluster's log past the backup"
        ));
    }
    let now = now_ms();
    let mut out = Writer::new(client, o, &mut report);
    // Rows of the full backup, each with its changes.
    let mut restored: HashSet<(String, Bytes)> = HashSet::new();
    for f in base.scopes.iter().flat_map(|s| &s.files) {
        if f.kind != FileKind::Rows || !wanted_table(&f.table) {
            continue;
        }
        let schema = d.placement.schema.table(&f.table);
        for rec in RecordReader::<pb::Row>::open(base_dir, f)? {
            let row = rec?;
            if !row.key.starts_with(&o.prefix) {
                continue;
            }
            let mut st = state_of(&row, schema);
            let at = (f.table.clone(), row.key.clone());
            if let Some(changes) = pending.remove(&at) {
                merge_changes(&mut st, &changes, schema);
            }
            if out
                .push(&f.table, &row.key, st, schema, now, progress)
                .await?
            {
                restored.insert(at);
            }
        }
    }
    // Rows the backup did not have that the changes made.
    let mut rest: Vec<((String, Bytes), Pending)> = pending.into_iter().collect();
    rest.sort_by(|a, b| a.0.cmp(&b.0));
    for ((table, key), changes) in rest {
        let schema = d.placement.schema.table(&table);
        let mut st = RowState::default();
        merge_changes(&mut st, &changes, schema);
        if out.push(&table, &key, st, schema, now, progress).await? {
            restored.insert((table, key));
        }
    }
    out.finish(progress).await?;
    if o.mode == Mode::Replace {
        // Rows that exist now but did not then, scope by scope from a replica
        // of it (another policy's rows are another backup's to restore).
        let location = client.location();
        for s in &base.scopes {
            let scope = ScopeId::new(s.scope.as_str());
            let Some(r) = candidates(&d, client, &scope).into_iter().next() else {
                bail!("scope {scope}: no replica to look for rows made since");
            };
            for table in base.tables.iter().filter(|t| wanted_table(t)) {
                let mut scan = ScanOptions {
                    limit: 1_000,
                    keys_only: true,
                    ..Default::default()
                };
                loop {
                    let page = client
                        .scan_at(
                            &r,
                            table,
                            o.prefix.clone(),
                            &scan,
                            &ReadFilter::default(),
                            o.deadline,
                        )
                        .await
                        .with_context(|| format!("scanning {table} at {r} for rows made since"))?;
                    for row in &page.rows {
                        if location.scope_of(&d, table, &row.key) == scope
                            && !restored.contains(&(table.clone(), row.key.clone()))
                        {
                            out.delete(table, &row.key, progress).await?;
                        }
                    }
                    if page.resume_key.is_empty() {
                        break;
                    }
                    scan.resume_after = page.resume_key;
                }
            }
        }
        out.finish(progress).await?;
    }
    drop(out);
    report.seconds = began.elapsed().as_secs_f64();
    Ok(report)
}

/// One full backup's rows of `table` under `prefix` as of its cut (each row
/// with its tail merged), checksums checked: what a restore of it at its cut
/// would write (for checkers and tests).
pub fn rows_at_cut(
    dir: &Path,
    table: &str,
    prefix: &[u8],
    schema: Option<&pangea_topology::schema::TableSchema>,
) -> Result<std::collections::BTreeMap<Bytes, RowState>> {
    let m = Manifest::load(dir)?;
    ensure!(m.kind == Kind::Full, "{}: not a full backup", dir.display());
    let limits = Limits::default();
    let mut rows = std::collections::BTreeMap::new();
    let files = m
        .scopes
        .iter()
        .flat_map(|s| &s.files)
        .filter(|f| f.table == table);
    let (row_files, change_files): (Vec<_>, Vec<_>) = files.partition(|f| f.kind == FileKind::Rows);
    for f in row_files {
        verify_file(dir, f)?;
        for rec in RecordReader::<pb::Row>::open(dir, f)? {
            let row = rec?;
            if row.key.starts_with(prefix) {
                rows.insert(row.key.clone(), state_of(&row, schema));
            }
        }
    }
    for f in change_files {
        verify_file(dir, f)?;
        for rec in RecordReader::<pb::Change>::open(dir, f)? {
            let c = Change::from_proto(rec?, &limits)?;
            let key = c.mutation.row_key().clone();
            if key.starts_with(prefix) {
                merge_changes(rows.entry(key).or_default(), &vec![(c, true)], schema);
            }
        }
    }
    Ok(rows)
}

/// The chain ending at `dir`: its full backup first.
fn chain_of(dir: &Path) -> Result<Vec<(PathBuf, Manifest)>> {
    let mut chain = Vec::new();
    let mut at = std::path::absolute(dir)?;
    loop {
        let m = Manifest::load(&at)?;
        let parent = m.parent.clone();
        chain.push((at.clone(), m));
        match parent {
            None => break,
            Some(p) => {
                ensure!(
                    chain.len() < 10_000,
                    "a backup chain of more than 10,000 backups"
                );
                let pm = Manifest::load(&p.dir).with_context(|| {
                    format!(
                        "{} continues backup {} at {}",
                        at.display(),
                        p.id,
                        p.dir.display()
                    )
                })?;
                ensure!(
                    pm.id == p.id,
                    "{} continues backup {}, but {} holds backup {}",
                    at.display(),
                    p.id,
                    p.dir.display(),
                    pm.id
                );
                at = p.dir;
            }
        }
    }
    chain.reverse();
    ensure!(
        chain[0].1.kind == Kind::Full,
        "{}: the chain does not start with a full backup",
        chain[0].0.display()
    );
    for w in chain.windows(2) {
        let (parent, child) = (&w[0].1, &w[1].1);
        for s in &child.scopes {
            let p = parent.scopes.iter().find(|p| p.scope == s.scope);
            ensure!(
                p.is_some_and(|p| p.end == s.start),
                "{}: scope {} does not start where {} ended",
                w[1].0.display(),
                s.scope,
                w[0].0.display()
            );
        }
    }
    Ok(chain)
}

/// The row as the backup holds it: every version it read, a counter as one
/// increment of its sum.
pub(crate) fn state_of(
    row: &pb::Row,
    schema: Option<&pangea_topology::schema::TableSchema>,
) -> RowState {
    let mut st = RowState::default();
    for (cell, m) in cell_mutations(row, schema) {
        let v = Version::new(
            Timestamp::from_u64(cell.timestamp),
            ReplicaId::new(cell.origin.as_str()),
        );
        st.apply(&v, &[m], schema);
    }
    st
}

/// Each cell of a row as a reader sees it, as the mutation that writes it: a
/// set, or for a counter one increment of its sum.
fn cell_mutations<'r>(
    row: &'r pb::Row,
    schema: Option<&pangea_topology::schema::TableSchema>,
) -> impl Iterator<Item = (&'r pb::Cell, Mutation)> {
    row.families.iter().flat_map(move |fam| {
        let counter = schema
            .and_then(|t| t.family(&fam.name))
            .is_some_and(|g| g.is_counter());
        let family: std::sync::Arc<str> = fam.name.as_str().into();
        fam.cells.iter().map(move |cell| {
            let m = if counter {
                Mutation::Increment {
                    family: family.clone(),
                    column: cell.column.clone(),
                    delta: pangea_core::row::count_of(&cell.value),
                }
            } else {
                Mutation::SetCell {
                    family: family.clone(),
                    column: cell.column.clone(),
                    value: cell.value.clone(),
                }
            };
            (cell, m)
        })
    })
}

fn merge_changes(
    st: &mut RowState,
    changes: &Pending,
    schema: Option<&pangea_topology::schema::TableSchema>,
) {
    for (c, counted) in changes {
        let m = &c.mutation;
        let version = m.cell_version(&Version::new(c.timestamp, c.origin.clone()));
        if *counted {
            let rest: Vec<Mutation> = m
                .mutations()
                .iter()
                .filter(|x| !matches!(x, Mutation::Increment { .. }))
                .cloned()
                .collect();
            st.apply(&version, &rest, schema);
        } else {
            st.apply(&version, m.mutations(), schema);
        }
    }
}

/// The change log of each scope of `last` past its cut, up to what the
/// replica read holds now; `keep` takes each change and says whether it is
/// kept. The number kept.
async fn read_log(
    client: &Client,
    d: &Deployment,
    last: &Manifest,
    o: &RestoreOptions,
    keep: &mut dyn FnMut(Change) -> bool,
) -> Result<u64> {
    let mut kept = 0;
    for s in &last.scopes {
        let scope = ScopeId::new(s.scope.as_str());
        let Some(r) = candidates(d, client, &scope).into_iter().next() else {
            bail!("scope {scope}: no replica to read its change log from");
        };
        let now = client.watermarks(&r).await?;
        // This scope from the cut; the others from now (passed over).
        let positions: Vec<(String, Vec<super::Position>)> = now
            .iter()
            .map(|w| match w.scope == scope {
                true => (s.scope.clone(), s.end.clone()),
                false => (w.scope.to_string(), super::Position::of(w)),
            })
            .collect();
        let target = now
            .iter()
            .find(|w| w.scope == scope)
            .with_context(|| format!("replica {r} reported no watermarks of scope {scope}"))?;
        for table in last
            .tables
            .iter()
            .filter(|t| o.table.as_deref().is_none_or(|w| w == t.as_str()))
        {
            let mut from = cursor_at(positions.iter().map(|(s, p)| (s.as_str(), p.as_slice())));
            loop {
                let page = client
                    .read_changes_at(
                        &r,
                        "",
                        table,
                        Bytes::new(),
                        &ChangesFrom::Cursor(from.encode()),
                        1_000,
                        o.deadline,
                    )
                    .await
                    .with_context(|| {
                        format!(
                            "reading {table}'s change log of scope {scope} from {r} past the \
                             backup's cut (its changes.retention must reach back to it)"
                        )
                    })?;
                for c in page.changes {
                    if c.scope == scope && keep(c) {
                        kept += 1;
                    }
                }
                from = Cursor::decode(&page.cursor).map_err(anyhow::Error::msg)?;
                let reached = target
                    .iter()
                    .all(|(origin, m)| from.position(&scope, origin) >= m.sequence);
                if reached || !page.more {
                    break;
                }
            }
        }
    }
    Ok(kept)
}

/// Batches restored rows into batch writes.
struct Writer<'a> {
    client: &'a Client,
    o: &'a RestoreOptions,
    report: &'a mut RestoreReport,
    /// Rows to send, each marked whether it deletes.
    batch: Vec<(RowMutation, bool)>,
    inflight: tokio::task::JoinSet<Written>,
}

impl std::fmt::Debug for Writer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("batch", &self.batch.len())
            .finish()
    }
}

impl<'a> Writer<'a> {
    fn new(client: &'a Client, o: &'a RestoreOptions, report: &'a mut RestoreReport) -> Self {
        Writer {
            client,
            o,
            report,
            batch: Vec::new(),
            inflight: tokio::task::JoinSet::new(),
        }
    }

    /// Queues the write of one restored row; whether the row exists as of
    /// the time (it was restored, not deleted).
    async fn push(
        &mut self,
        table: &str,
        key: &Bytes,
        st: RowState,
        schema: Option<&pangea_topology::schema::TableSchema>,
        now_ms: u64,
        progress: &mut (dyn FnMut(String) + Send),
    ) -> Result<bool> {
        let limits = Limits::default();
        let view = st.read(key, &ReadFilter::default(), schema, now_ms);
        let exists = view.is_some();
        let m = match (self.o.mode, view) {
            (Mode::Merge, None) => return Ok(false),
            (Mode::Merge, Some(_)) => RowMutation::new(
                table,
                key.clone(),
                vec![Mutation::MergeRow(Box::new(st))],
                &limits,
            ),
            (Mode::Replace, None) => {
                RowMutation::new(table, key.clone(), vec![Mutation::DeleteFromRow], &limits)
            }
            (Mode::Replace, Some(row)) => {
                let mut ms = vec![Mutation::DeleteFromRow];
                ms.extend(cell_mutations(&row, schema).map(|(_, m)| m));
                RowMutation::new(table, key.clone(), ms, &limits)
            }
        };
        match m {
            Ok(m) => self.batch.push((m, !exists)),
            Err(e) => {
                self.report.rows_failed += 1;
                progress(format!("{table} row {}: not written: {e}", show_key(key)));
            }
        }
        if self.batch.len() >= self.o.batch_rows {
            self.flush(progress).await?;
        }
        Ok(exists)
    }

    /// Queues the delete of a row that did not exist as of the time.
    async fn delete(
        &mut self,
        table: &str,
        key: &Bytes,
        progress: &mut (dyn FnMut(String) + Send),
    ) -> Result<()> {
        let m = RowMutation::new(
            table,
            key.clone(),
            vec![Mutation::DeleteFromRow],
            &Limits::default(),
        )?;
        self.batch.push((m, true));
        if self.batch.len() >= self.o.batch_rows {
            self.flush(progress).await?;
        }
        Ok(())
    }

    /// Sends the queued rows as one batch write, with at most
    /// [`BATCHES_IN_FLIGHT`] in flight (their rows are of distinct keys: a
    /// restore writes each key once).
    async fn flush(&mut self, progress: &mut (dyn FnMut(String) + Send)) -> Result<()> {
        if !self.batch.is_empty() {
            // A row sent again after an unknown outcome is harmless: it sets the
            // same state (a replace: at a later time, the same values).
            let opts = WriteOptions {
                deadline: Some(self.o.deadline),
                resend_if_unknown: true,
                ..WriteOptions::default()
            };
            let rows = std::mem::take(&mut self.batch);
            self.inflight
                .spawn(write_batch(self.client.clone(), rows, opts));
        }
        while self.inflight.len() >= BATCHES_IN_FLIGHT {
            self.join_one(progress).await?;
        }
        Ok(())
    }

    /// Sends what is queued and waits for every batch.
    async fn finish(&mut self, progress: &mut (dyn FnMut(String) + Send)) -> Result<()> {
        self.flush(progress).await?;
        while !self.inflight.is_empty() {
            self.join_one(progress).await?;
        }
        Ok(())
    }

    async fn join_one(&mut self, progress: &mut (dyn FnMut(String) + Send)) -> Result<()> {
        let Some(done) = self.inflight.join_next().await else {
            return Ok(());
        };
        let done = done.context("a batch write task failed")?;
        for p in done.problems {
            progress(p);
        }
        let before = self.report.rows_written + self.report.rows_deleted;
        self.report.rows_failed += done.failed;
        self.report.rows_deleted += done.deleted;
        self.report.rows_written += done.written;
        let total = self.report.rows_written + self.report.rows_deleted;
        if total / 50_000 != before / 50_000 {
            progress(format!("{total} rows written"));
        }
        Ok(())
    }
}

/// Batch writes a restore keeps in flight.
const BATCHES_IN_FLIGHT: usize = 8;

/// What one batch write did.
#[derive(Debug, Default)]
struct Written {
    written: u64,
    deleted: u64,
    failed: u64,
    problems: Vec<String>,
}

/// Writes `rows` (each marked whether it deletes), each again up to twice if
/// it failed.
async fn write_batch(
    client: Client,
    mut rows: Vec<(RowMutation, bool)>,
    opts: WriteOptions,
) -> Written {
    let mut out = Written::default();
    for attempt in 0..3 {
        if rows.is_empty() {
            break;
        }
        let ms: Vec<RowMutation> = rows.iter().map(|(m, _)| m.clone()).collect();
        let results = client.mutate_rows(ms, &opts).await;
        let mut again = Vec::new();
        for ((m, delete), r) in rows.into_iter().zip(results) {
            match r {
                Ok(_) if delete => out.deleted += 1,
                Ok(_) => out.written += 1,
                Err(e) if attempt == 2 => {
                    out.failed += 1;
                    out.problems.push(format!(
                        "{} row {}: not written: {e}",
                        m.table(),
                        show_key(m.row_key())
                    ));
                }
                Err(_) => again.push((m, delete)),
            }
        }
        rows = again;
    }
    out
}

fn show_key(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(s) if s.chars().all(|c| !c.is_control()) => format!("{s:?}"),
        _ => format!("0x{}", super::hex(key)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(origin: &str, seq: u64, ts: u64, key: &str, ms: Vec<Mutation>) -> Change {
        Change {
            scope: ScopeId::new("global"),
            origin: ReplicaId::new(origin),
            sequence: seq,
            timestamp: Timestamp::new(ts, 0),
            mutation: RowMutation::new("t", Bytes::from(key.to_owned()), ms, &Limits::default())
                .unwrap(),
        }
    }

    fn set(v: &str) -> Mutation {
        Mutation::SetCell {
            family: "f".into(),
            column: Bytes::from_static(b"c"),
            value: Bytes::from(v.to_owned()),
        }
    }

    fn value(st: &RowState) -> Option<Bytes> {
        let row = st.read(&Bytes::from_static(b"k"), &ReadFilter::default(), None, 0)?;
        Some(row.families[0].cells[0].value.clone())
    }

    /// A row read in the middle of a backup, with the tail merged, is the row
    /// at the cut: the changes it held change nothing, the others apply.
    #[test]
    fn a_row_with_its_tail_is_the_row_at_the_cut() {
        let c1 = change("a", 1, 10, "k", vec![set("one")]);
        let c2 = change("a", 2, 20, "k", vec![set("two")]);
        let c3 = change("b", 1, 15, "k", vec![Mutation::DeleteFromRow]);
        // The replica had applied c1 and c2 when the row was read.
        let mut exact = RowState::default();
        for c in [&c1, &c2, &c3] {
            merge_changes(&mut exact, &vec![(c.clone(), false)], None);
        }
        let read = {
            let mut st = RowState::default();
            merge_changes(
                &mut st,
                &vec![(c1.clone(), false), (c2.clone(), false)],
                None,
            );
            let row = st
                .read(
                    &Bytes::from_static(b"k"),
                    &ReadFilter::everything(),
                    None,
                    0,
                )
                .unwrap();
            state_of(&row, None)
        };
        let mut restored = read;
        merge_changes(
            &mut restored,
            &vec![(c1, true), (c2, true), (c3, true)],
            None,
        );
        assert_eq!(value(&restored), value(&exact));
        assert_eq!(value(&restored).as_deref(), Some(&b"two"[..]));
    }
}
