//! Applying entries of a stream: in order, duplicates dropped, early ones
//! buffered; location metadata that changes with them (and rows a migration moved
//! away); each entry forwarded along the scope's tree.

use super::*;

impl<S: Storage> Replica<S> {
    /// Applies one entry in stream order: row change, log entry and watermark in one
    /// atomic write (I2).
    pub(super) fn apply_entry(&mut self, now: Now, e: &LogEntry) -> Result<(), StorageError> {
        let d = self.deployment.clone();
        let holds_row = self.stores_rows && self.may_hold(e.mutation.table(), e.mutation.row_key());
        let Some(s) = self.scopes.get(&e.scope) else {
            return Ok(());
        };
        let horizon = s.purge_horizon;
        let applied = s.streams.get(&e.origin).map(|st| st.applied);
        let wm = Watermark {
            sequence: e.sequence,
            timestamp: e.timestamp.max(applied.unwrap_or_default().timestamp),
        };
        let is_location = &**e.mutation.table() == LOCATION_TABLE;
        let is_job = &**e.mutation.table() == JOBS_TABLE;
        let mut location_row = None;
        if holds_row {
            let a = RowApply {
                entry: e,
                compaction: Compaction {
                    deployment: &d,
                    horizon,
                    now_ms: now.wall_ms,
                },
            };
            self.storage.apply_entry_to_row(&a, wm)?;
            if is_location {
                let (table, key) = (e.mutation.table(), e.mutation.row_key());
                location_row = self.storage.get_row(table, key)?;
            }
        } else {
            self.storage.append_entry(e, wm)?;
        }
        let st = self
            .scopes
            .get_mut(&e.scope)
            .expect("looked up above")
            .streams
            .get_or_default(&e.origin);
        st.applied = wm;
        st.dirty = false;
        st.known_last = st.known_last.max(e.sequence);
        // A heartbeat seen earlier may now apply.
        if st.heartbeat.0 <= wm.sequence && st.heartbeat.1 > st.applied.timestamp {
            st.applied.timestamp = st.heartbeat.1;
            st.dirty = true;
        }
        list_moved(&mut self.moved, st, &e.scope, &e.origin);
        self.stats.applied += 1;
        self.events.push_back(Event::Applied {
            scope: e.scope.clone(),
            origin: e.origin.clone(),
            sequence: e.sequence,
            timestamp: e.timestamp,
        });
        if is_location {
            self.location_changed(e.mutation.row_key(), location_row.as_ref())?;
        }
        if is_job && holds_row && self.is_first_process_of_mine(&e.origin) {
            self.note_assigned_job(e.mutation.row_key())?;
        }
        Ok(())
    }

    /// Whether `origin` is process 0 of this process's replica (and not this
    /// process): the one that records the parts of the migrations its replica runs.
    fn is_first_process_of_mine(&self, origin: &ReplicaId) -> bool {
        origin != &self.id
            && self
                .deployment
                .topology
                .replica(self.id.as_str())
                .is_some_and(|me| me.index > 0 && *origin == me.of)
    }

    /// A `_jobs` row changed: if it records a part of a migration for this process
    /// to run, not yet started, hand it to the driver
    /// ([`Replica::take_assigned_jobs`]).
    pub(super) fn note_assigned_job(&mut self, key: &Bytes) -> Result<(), StorageError> {
        let job = self
            .storage
            .get_row(JOBS_TABLE, key)?
            .and_then(|row| crate::location::decode_job(key, &row));
        if let Some(job) = job.filter(|j| {
            j.runner == self.id.as_str() && !j.part_of.is_empty() && j.phase == "planned"
        }) {
            self.assigned_jobs.push(job);
        }
        Ok(())
    }

    /// A `_location` row changed: update the location table (a valid entry only),
    /// and if rows under its prefix may no longer live here because a migration
    /// flipped them away, purge them from this replica's store (I10). The purge is
    /// local: the rows live on in the replicas their policy allows. Only the flip of
    /// a job whose `_jobs` row says it finished its backfill to exactly that policy
    /// purges; any other entry that excludes this replica leaves the rows in place.
    fn location_changed(
        &mut self,
        key: &Bytes,
        row: Option<&RowState>,
    ) -> Result<(), StorageError> {
        let entry = match self.location.apply_row(&self.deployment, key, row) {
            LocationChange::InForce(entry) => entry,
            LocationChange::Removed => return Ok(()),
            LocationChange::Refused(invalid) => {
                self.events.push_back(Event::LocationRefused(invalid));
                return Ok(());
            }
        };
        if !self.stores_rows {
            return Ok(());
        }
        // What of the rows under the prefix may still be held here. With shard
        // groups: none if this process hosts no group of the entry's policies;
        // else, once no migration is under way, a flip still purges the rows that
        // may not stay (rows of the global policy's group 0, which every process
        // holds, moved to a policy that puts their group on one process), and
        // nothing else is withheld.
        let d = &self.deployment;
        let keep = if d.topology.shard_groups > 1 {
            let some_group = |p: &ScopeId| {
                d.placement
                    .policy(p)
                    .is_some_and(|p| p.scopes().iter().any(|s| self.scopes.contains_key(s)))
            };
            if !(some_group(&entry.policy) || entry.migrating_to.as_ref().is_some_and(some_group)) {
                Keep::Nothing
            } else if entry.migrating_to.is_none() {
                Keep::Some
            } else {
                Keep::All
            }
        } else if self.may_hold(&entry.table, &entry.prefix) {
            Keep::All
        } else {
            Keep::Nothing
        };
        if keep == Keep::All {
            return Ok(());
        }
        let job_key = Bytes::from(entry.job_id.clone().into_bytes());
        let job = self
            .storage
            .get_row(JOBS_TABLE, &job_key)?
            .and_then(|row| crate::location::decode_job(&job_key, &row));
        if job.is_some_and(|job| entry.is_flip_of(&job)) {
            self.pending_purges
                .push((entry.table, entry.prefix, entry.job_id));
        } else if keep == Keep::Nothing {
            self.events.push_back(Event::PurgeWithheld {
                table: entry.table,
                prefix: entry.prefix,
                policy: entry.policy,
            });
        }
        Ok(())
    }

    /// Deletes, from this replica's store only, the rows a placement flip moved to a
    /// policy that excludes this replica (I10). Drivers call it after publishing the
    /// new location metadata to their serving path; the rows live on at the replicas
    /// their policy allows. Returns what was purged: per flipped (table, prefix),
    /// the migration job and the number of rows.
    pub fn purge_moved_rows(&mut self) -> Result<Vec<Purged>, StorageError> {
        let mut done = Vec::new();
        for (table, prefix, job_id) in std::mem::take(&mut self.pending_purges) {
            let mut purged = 0;
            let mut after: Option<Bytes> = None;
            loop {
                let rows = self
                    .storage
                    .scan_rows(&table, &prefix, after.as_deref(), 1_000)?;
                let Some((last, _)) = rows.last() else { break };
                after = Some(last.clone());
                let mut batch = WriteBatch::default();
                for (key, _) in rows {
                    // Only rows this entry governs (a longer prefix may say otherwise).
                    if !self.may_hold(&table, &key) {
                        batch.rows.push(RowWrite {
                            table: table.clone(),
                            key,
                            row: None,
                        });
                    }
                }
                purged += batch.rows.len() as u64;
                if !batch.rows.is_empty() {
                    self.storage.write(batch)?;
                }
            }
            done.push(Purged {
                table,
                prefix,
                job_id,
                rows: purged,
            });
        }
        Ok(done)
    }

    /// Accepts an entry from `from`: applies it if next in line, buffers it if early,
    /// drops it if old. Forwards what it applies.
    pub(super) fn accept(&mut self, now: Now, from: &ReplicaId, e: LogEntry) -> Result<(), Error> {
        let Some(s) = self.scopes.get(&e.scope) else {
            self.reject(from, Reject::UnknownScope);
            return Ok(());
        };
        if !s.origins.contains(&e.origin) || !s.members.contains(from) {
            self.reject(from, Reject::NotInScope);
            return Ok(());
        }
        let s = &self.scopes[&e.scope];
        // Copy the watermark only: cloning the whole stream (with its buffer of up to
        // `reorder_window` out-of-order entries) for every entry made catching up
        // quadratic; a replica restarted behind a busy origin spent over a minute of
        // CPU in here, unable to heartbeat (pangea-cli/tests/node_process.rs).
        let applied = s
            .streams
            .get(&e.origin)
            .map(|st| st.applied)
            .unwrap_or_default();
        if e.sequence <= applied.sequence {
            self.stats.duplicates += 1;
            return Ok(());
        }
        if e.origin == self.id && !self.relearning.contains_key(&e.scope) {
            // We never lose our own durable writes; something claims to be ours.
            self.reject(from, Reject::ForeignOwnSequence);
            return Ok(());
        }
        if e.sequence > applied.sequence + self.config.reorder_window {
            self.reject(from, Reject::SequenceTooFarAhead);
            let st = self.stream_mut(&e.scope, &e.origin);
            st.known_last = st.known_last.max(st.applied.sequence + 1);
            st.hint = Some(from.clone());
            self.maybe_request_gap(now, &e.scope.clone(), &e.origin.clone());
            return Ok(());
        }
        if let Err(err) = self.clock.observe(now.wall_ms, e.timestamp) {
            let _ = err;
            self.reject(from, Reject::TimestampAhead);
            return Ok(());
        }
        let (scope, origin) = (e.scope.clone(), e.origin.clone());
        if e.sequence == applied.sequence + 1 {
            self.apply_entry(now, &e)?;
            self.forward(now, &e, Some(from));
            self.drain_pending(now, &scope, &origin)?;
        } else {
            let st = self.stream_mut(&scope, &origin);
            st.known_last = st.known_last.max(e.sequence);
            st.hint = Some(from.clone());
            if st.pending.insert(e.sequence, (e, from.clone())).is_none() {
                self.stats.buffered += 1;
            }
            self.maybe_request_gap(now, &scope, &origin);
        }
        Ok(())
    }

    pub(super) fn stream_mut(&mut self, scope: &ScopeId, origin: &ReplicaId) -> &mut Stream {
        self.scopes
            .get_mut(scope)
            .expect("callers checked the scope exists")
            .streams
            .get_or_default(origin)
    }

    /// Applies buffered entries that have become next in line.
    pub(super) fn drain_pending(
        &mut self,
        now: Now,
        scope: &ScopeId,
        origin: &ReplicaId,
    ) -> Result<(), Error> {
        loop {
            let st = self.stream_mut(scope, origin);
            let next = st.applied.sequence + 1;
            // Entries at or below the watermark (e.g. after a snapshot) are stale.
            while st.pending.first_key_value().is_some_and(|(s, _)| *s < next) {
                st.pending.pop_first();
            }
            let Some((e, from)) = st.pending.remove(&next) else {
                // Nothing more in line: caught up, or still missing something.
                if st.known_last <= st.applied.sequence {
                    st.gap = None;
                    st.behind_since_us = None;
                    return Ok(());
                }
                break;
            };
            self.apply_entry(now, &e)?;
            self.forward(now, &e, Some(&from));
        }
        self.maybe_request_gap(now, scope, origin);
        Ok(())
    }

    /// Queues `e` for every tree neighbour but `except`.
    pub(super) fn forward(&mut self, _now: Now, e: &LogEntry, except: Option<&ReplicaId>) {
        let Some(s) = self.scopes.get(&e.scope) else {
            return;
        };
        let bytes = e.wire_bytes();
        for n in s.forward_set(&self.id).filter(|n| Some(*n) != except) {
            // Residency (principle 5): never toward a replica outside the scope.
            if !s.members.contains(n) {
                continue;
            }
            let Some(p) = self.peers.get_mut(n) else {
                continue;
            };
            if p.queued_bytes + bytes > self.config.queued_bytes_max {
                // Gap repair will fetch it when the peer catches up.
                self.stats.dropped_queue_full += 1;
                continue;
            }
            p.queued_bytes += bytes;
            p.mutations.push_back((e.clone(), bytes));
        }
    }
}

/// What a location entry leaves here of the rows under its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// Every row may stay.
    All,
    /// Some may not (shard groups: rows every process holds, moved to a policy
    /// that puts them on one): a flip purges those.
    Some,
    /// None may: a flip purges them; another entry saying so is withheld.
    Nothing,
}
