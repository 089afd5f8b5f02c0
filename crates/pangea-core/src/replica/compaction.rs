//! Compaction: the purge horizon from every member's reports, and truncating the
//! logs every member has applied.

use super::*;

/// Most log entries one purge removes, over all streams. A replica taking in a
/// bulk load gathers ~15,000 entries a second that every member has; removing
/// them in one go held its driver (and every local write waiting for it) for
/// ~25 ms each compaction. A purge that stops here goes on after
/// [`PURGE_AGAIN_US`], in slices of a few ms with the driver's other work between.
pub(super) const PURGE_ENTRIES_MAX: u64 = 2_000;

/// How soon a purge that stopped at [`PURGE_ENTRIES_MAX`] goes on.
pub(super) const PURGE_AGAIN_US: u64 = 10_000;

impl<S: Storage> Replica<S> {
    /// Recomputes purge horizons, truncates logs below them (at most
    /// [`PURGE_ENTRIES_MAX`] entries), and sweeps some rows. `true`: the purge
    /// stopped at its budget, and should go on soon.
    #[inline(never)]
    pub(super) fn compact(&mut self, now: Now) -> Result<bool, Error> {
        let more = self.purge_logs(now)?;
        self.sweep_rows(now)?;
        Ok(more)
    }

    /// Recomputes purge horizons and truncates the logs below them, removing at
    /// most [`PURGE_ENTRIES_MAX`] entries; `true` if it left some for later.
    /// With change streams (a table's `changes.retention`), an entry also stays
    /// until it is that old (by its HLC time against this replica's clock), and
    /// while a registered reader has not read it (`changes::Readers`).
    pub(super) fn purge_logs(&mut self, now: Now) -> Result<bool, Error> {
        let mut budget = PURGE_ENTRIES_MAX;
        let mut more = false;
        let keep_after = self
            .deployment
            .placement
            .schema
            .change_retention_ms()
            .map(|ms| Timestamp::new(now.wall_ms.saturating_sub(ms), 0));
        let holds = self.readers.holds(now.wall_ms);
        let scopes: Vec<ScopeId> = self.scopes.keys().cloned().collect();
        for scope in scopes {
            let s = self.scopes.get_mut(&scope).expect("listed above");
            // Our own durable state counts as our report.
            let mine = Report::from_sorted(s.durable_watermarks().collect());
            s.applied_by.insert(self.id.clone(), mine);
            // The horizon needs a report from every member (I5): until then, nothing.
            let complete = s.members.iter().all(|m| s.applied_by.contains_key(m));
            if !complete || s.origins.is_empty() {
                continue;
            }
            // Per origin (in origin order), the least any member reported; an origin
            // missing from a report counts as nothing applied. Both are in origin
            // order, so each report is one walk.
            let mut horizon_seq = vec![u64::MAX; s.origins.len()];
            let mut horizon_ts = Timestamp::MAX;
            for m in s.members.iter() {
                let mut report = s.applied_by[m].0.iter().peekable();
                for (o, h) in s.origins.iter().zip(&mut horizon_seq) {
                    while report.next_if(|(r, _)| r < o).is_some() {}
                    let w = report
                        .next_if(|(r, _)| r == o)
                        .map_or_else(Watermark::default, |(_, w)| *w);
                    *h = (*h).min(w.sequence);
                    horizon_ts = horizon_ts.min(w.timestamp);
                }
            }
            if horizon_ts > s.purge_horizon {
                s.purge_horizon = horizon_ts;
            }
            let mut batch = WriteBatch::default();
            for (o, h) in s.origins.iter().zip(horizon_seq) {
                let applied = s.streams.get(o).map_or(0, |st| st.durable.sequence);
                let mut keep_from =
                    (h + 1).max(applied.saturating_sub(self.config.log_entries_retained_max));
                if !holds.is_empty()
                    && let Some(read) = holds.get(&(scope.clone(), o.clone()))
                {
                    keep_from = keep_from.min(read + 1);
                }
                if let Some((first, _)) = self.storage.log_bounds(&scope, o)?
                    && first < keep_from
                {
                    let mut take = (keep_from - first).min(budget);
                    if let Some(keep_after) = keep_after {
                        take =
                            entries_older_than(&self.storage, &scope, o, first, take, keep_after)?;
                    }
                    more |= take < keep_from - first;
                    budget -= take;
                    if take > 0 {
                        batch
                            .truncate_log
                            .push((scope.clone(), o.clone(), first + take));
                    }
                }
            }
            if !batch.is_empty() {
                self.storage.write(batch)?;
            }
        }
        Ok(more)
    }

    /// Purges tombstones and expired versions of rows nobody writes to, in a sweep
    /// of a bounded number of rows that resumes where the last one stopped.
    fn sweep_rows(&mut self, now: Now) -> Result<(), Error> {
        const SWEEP_ROWS_MAX: usize = 1_000;
        let d = self.deployment.clone();
        if self.stores_rows {
            let tables: Vec<Arc<str>> = d.placement.schema.tables.keys().cloned().collect();
            if tables.is_empty() {
                return Ok(());
            }
            let (table, after) = self
                .sweep
                .take()
                .unwrap_or_else(|| (tables[0].clone(), Bytes::new()));
            // Rows are looked at in place; only those compaction changes are copied.
            let schema = d.placement.schema.table(&table);
            let (location, scopes) = (&self.location, &self.scopes);
            // A row that needs nothing at the latest horizon of any scope needs
            // nothing at its own (purging only grows with the horizon): most rows are
            // passed over on their compaction hint alone, before finding their scope.
            let latest_horizon = scopes.values().map(|s| s.purge_horizon).max();
            // Keys by the horizon of their scope.
            let mut due: BTreeMap<Timestamp, Vec<Bytes>> = BTreeMap::new();
            let last = self.storage.visit_rows(
                &table,
                b"",
                (!after.is_empty()).then_some(&after[..]),
                SWEEP_ROWS_MAX,
                &mut |key, row| {
                    if latest_horizon.is_none_or(|h| !row.needs_compact(schema, h, now.wall_ms)) {
                        return;
                    }
                    let scope = location.scope_of(&d, &table, key);
                    if let Some(horizon) = scopes.get(&scope).map(|s| s.purge_horizon)
                        && row.needs_compact(schema, horizon, now.wall_ms)
                    {
                        due.entry(horizon).or_default().push(key.clone());
                    }
                },
            )?;
            for (horizon, keys) in due {
                let c = Compaction {
                    deployment: &d,
                    horizon,
                    now_ms: now.wall_ms,
                };
                self.storage.compact_rows(&table, keys, &c)?;
            }
            let next = match last {
                Some(k) => (table, k),
                None => {
                    let i = tables
                        .iter()
                        .position(|t| *t == table)
                        .map_or(0, |i| (i + 1) % tables.len());
                    (tables[i].clone(), Bytes::new())
                }
            };
            self.sweep = Some(next);
        }
        Ok(())
    }
}

/// How many of the `max` log entries of (scope, origin) from `first` on were
/// written before `before` (entries are in time order: an origin's clock only
/// moves forward). The first entry is looked at alone, so a log kept for
/// retention costs one read a compaction until its head is old enough.
fn entries_older_than<S: Storage>(
    storage: &S,
    scope: &ScopeId,
    origin: &ReplicaId,
    first: u64,
    max: u64,
    before: Timestamp,
) -> Result<u64, Error> {
    let head = storage.read_log(scope, origin, first, 1, usize::MAX)?;
    let head_old = head.first().is_some_and(|e| e.timestamp < before);
    if !head_old || max == 0 {
        return Ok(0);
    }
    if max == 1 {
        return Ok(1);
    }
    let entries = storage.read_log(scope, origin, first, max as usize, usize::MAX)?;
    Ok(entries.iter().take_while(|e| e.timestamp < before).count() as u64)
}
