//! Snapshots: a scope's rows and watermarks for a replica whose gap is older than
//! any neighbour's log, sent in bounded chunks and installed.

use super::*;

impl<S: Storage> Replica<S> {
    #[cold]
    pub(super) fn request_snapshot(&mut self, now: Now, scope: &ScopeId, from: &ReplicaId) {
        let Some(s) = self.scopes.get_mut(scope) else {
            return;
        };
        if s.incoming.is_some() {
            return;
        }
        s.incoming = Some(Incoming {
            from: from.clone(),
            snapshot_id: None,
            next_index: 0,
            rows: 0,
            asked_at_us: now.mono_us,
        });
        self.events.push_back(Event::SnapshotNeeded {
            scope: scope.clone(),
            from: from.clone(),
        });
        self.queue_frame(
            from,
            Frame::SnapshotRequest {
                scope: scope.clone(),
            },
        );
    }

    #[cold]
    pub(super) fn handle_snapshot_request(&mut self, from: &ReplicaId, scope: ScopeId) {
        let Some(s) = self.scopes.get(&scope) else {
            self.reject(from, Reject::UnknownScope);
            return;
        };
        if !s.members.contains(from) {
            self.reject(from, Reject::NotInScope);
            return;
        }
        if !self.stores_rows {
            return; // relays hold no rows; the requester will time out and ask elsewhere
        }
        // The snapshot's rows are read over time while writes continue; every row
        // includes at least what these watermarks cover, and rows merge as CRDTs, so
        // a fuzzy snapshot plus the stream from these watermarks on converges (I9).
        // With the streams of origins that retired from the scope (a resize moved
        // their group away): whoever takes the group from here must know how far
        // they went, should the same process host it again (its sequences then
        // go on from there).
        let mut watermarks: Vec<(ReplicaId, Watermark)> = s.durable_watermarks().collect();
        watermarks.extend(
            s.streams
                .iter()
                .filter(|(o, _)| {
                    !s.origins.contains(o) && crate::read::retired_from(&self.deployment, &scope, o)
                })
                .map(|(o, st)| (o.clone(), st.durable)),
        );
        let tables: VecDeque<Arc<str>> = self
            .deployment
            .placement
            .schema
            .tables
            .keys()
            .cloned()
            .collect();
        let snapshot_id = self.rng.next_u64();
        self.stats.snapshots_sent += 1;
        if let Some(p) = self.peers.get_mut(from) {
            p.outgoing.retain(|o| o.scope != scope);
            p.outgoing.push_back(Outgoing {
                scope,
                snapshot_id,
                index: 0,
                watermarks,
                tables,
                after: None,
                parts: VecDeque::new(),
            });
        }
    }

    /// The next chunk of an outgoing snapshot, reading rows as it goes. A chunk
    /// holds rows of one table, at most `snapshot_chunk_bytes_max` of them (about:
    /// keys and 64 bytes a row are counted besides [`RowState::value_bytes`]), and
    /// a row larger than that goes in parts, one chunk each, that the receiver's
    /// merge puts back together.
    #[cold]
    pub(super) fn next_chunk(&mut self, o: &mut Outgoing) -> Result<SnapshotChunk, StorageError> {
        const SCAN_ROWS: usize = 256;
        let max = self.config.snapshot_chunk_bytes_max;
        let d = self.deployment.clone();
        let mut rows = Vec::new();
        let mut bytes = 0;
        let mut table: Option<Arc<str>> = None;
        if let Some(part) = o.parts.pop_front() {
            rows.push(part);
            table = o.tables.front().cloned();
            bytes = max; // a part is a chunk of its own
        }
        let mut full = false;
        while bytes < max && !full {
            let Some(current) = o.tables.front().cloned() else {
                break;
            };
            if table.as_ref().is_some_and(|t| *t != current) {
                break;
            }
            let batch = self
                .storage
                .scan_rows(&current, b"", o.after.as_deref(), SCAN_ROWS)?;
            if batch.is_empty() {
                o.tables.pop_front();
                o.after = None;
                continue;
            }
            for (key, row) in batch {
                let size = key.len() + row.value_bytes() + 64;
                // A row that would take the chunk past its size waits for the next.
                if !rows.is_empty() && bytes + size > max {
                    full = true;
                    break;
                }
                o.after = Some(key.clone());
                if self.location.scope_of(&d, &current, &key) != o.scope {
                    continue;
                }
                table = Some(current.clone());
                if size > max {
                    let mut parts = row.split(max.saturating_sub(key.len() + 64));
                    let first = parts.remove(0);
                    self.stats.snapshot_rows_split += 1;
                    o.parts = parts.into_iter().map(|p| (key.clone(), p)).collect();
                    rows.push((key, first));
                    full = true;
                    break;
                }
                bytes += size;
                rows.push((key, row));
                if bytes >= max {
                    break;
                }
            }
        }
        // Last only once every table is exhausted (a later call finds none left).
        let last = o.tables.is_empty();
        let chunk = SnapshotChunk {
            scope: o.scope.clone(),
            snapshot_id: o.snapshot_id,
            index: o.index,
            table: table.unwrap_or_else(|| Arc::from("")),
            rows,
            watermarks: if last {
                o.watermarks.clone()
            } else {
                Vec::new()
            },
            last,
        };
        o.index += 1;
        Ok(chunk)
    }

    #[cold]
    pub(super) fn handle_snapshot_chunk(
        &mut self,
        now: Now,
        from: &ReplicaId,
        c: SnapshotChunk,
    ) -> Result<(), Error> {
        let d = self.deployment.clone();
        let Some(s) = self.scopes.get_mut(&c.scope) else {
            self.reject(from, Reject::UnknownScope);
            return Ok(());
        };
        let Some(inc) = s.incoming.as_mut() else {
            return Ok(());
        };
        if &inc.from != from
            || inc.snapshot_id.is_some_and(|id| id != c.snapshot_id)
            || c.index != inc.next_index
        {
            return Ok(()); // a stale or out-of-order snapshot: ignore
        }
        inc.snapshot_id = Some(c.snapshot_id);
        inc.next_index += 1;
        inc.asked_at_us = now.mono_us;
        inc.rows += c.rows.len() as u64;
        let horizon = s.purge_horizon;
        let mut batch = WriteBatch::default();
        if self.stores_rows && !c.rows.is_empty() {
            let table = d.placement.schema.table(&c.table);
            for (key, incoming) in c.rows {
                // Residency: a row of another scope has no business here.
                if self.location.scope_of(&d, &c.table, &key) != c.scope {
                    self.reject(from, Reject::NotInScope);
                    continue;
                }
                let mut row = self.storage.get_row(&c.table, &key)?.unwrap_or_default();
                row.merge(&incoming, table);
                row.compact(table, horizon, now.wall_ms);
                batch.rows.push(RowWrite {
                    table: c.table.clone(),
                    key,
                    row: (!row.is_empty()).then_some(row),
                });
            }
        }
        if c.last {
            let s = self.scopes.get_mut(&c.scope).expect("checked above");
            let rows = s.incoming.take().map_or(0, |i| i.rows);
            for (origin, wm) in &c.watermarks {
                if !s.origins.contains(origin) && !crate::read::retired_from(&d, &c.scope, origin) {
                    continue;
                }
                let st = s.streams.get_or_default(origin);
                if wm.sequence > st.applied.sequence
                    || (wm.sequence == st.applied.sequence && wm.timestamp > st.applied.timestamp)
                {
                    st.applied = *wm;
                    st.known_last = st.known_last.max(wm.sequence);
                    list_moved(&mut self.moved, st, &c.scope, origin);
                    batch
                        .watermarks
                        .push((c.scope.clone(), origin.clone(), *wm));
                }
            }
            self.storage.write(batch)?;
            self.stats.snapshots_installed += 1;
            self.copying.remove(&c.scope);
            self.events.push_back(Event::SnapshotInstalled {
                scope: c.scope.clone(),
                rows,
            });
            // Parts of migrations recorded for this process while it was away.
            if &c.scope == d.system_scope() && self.stores_rows {
                let jobs = self.storage.scan_rows(JOBS_TABLE, b"", None, usize::MAX)?;
                for (key, _) in jobs {
                    self.note_assigned_job(&key)?;
                }
            }
            let origins: Vec<ReplicaId> = self.scopes[&c.scope].origins.iter().cloned().collect();
            let relearning = self.relearning.contains_key(&c.scope);
            for origin in origins {
                if origin != self.id || relearning {
                    self.stream_mut(&c.scope, &origin).gap = None;
                    self.drain_pending(now, &c.scope, &origin)?;
                }
            }
        } else if !batch.is_empty() {
            self.storage.write(batch)?;
        }
        Ok(())
    }
}
