//! Local writes: proposing a mutation (validation, placement, row size, the
//! clock fence), sequence and timestamp, and the flush that makes them durable,
//! acknowledges them and sends them.

use super::*;

impl<S: Storage> Replica<S> {
    /// Applies a local write: the next sequence of its (scope, self) stream and a new
    /// HLC timestamp. The returned token is valid at once for reads here, but the
    /// write is durable — and may be acknowledged to the client — only after
    /// [`Replica::flush`] emits [`Event::Committed`] for it.
    pub fn propose(&mut self, now: Now, mutation: RowMutation) -> Result<Token, Error> {
        mutation.check_schema(&self.deployment.placement.schema)?;
        mutation.check_event_time(&self.deployment.placement.schema, self.stamp_ms_bound(now))?;
        if &**mutation.table() == LOCATION_TABLE {
            crate::location::check_location_write(&mutation, &self.deployment)?;
        }
        self.check_row_size(&mutation)?;
        let scope = self.scope_of(mutation.table(), mutation.row_key());
        // During a migration writes go to both policies' streams, so only a replica
        // of both may take them (no write can slip past the backfill).
        let also = self
            .location
            .migrating_scope(&self.deployment, mutation.table(), mutation.row_key())
            .cloned();
        if let Some(b) = also.filter(|b| b != &scope) {
            if !self.scopes.contains_key(&b) {
                return Err(Error::PolicyForbids {
                    scope: format!("{scope} (migrating to {b})"),
                    replica: self.id.to_string(),
                });
            }
            // Both streams are checked before either is written: a write refused
            // after its first half was appended would be reported not applied
            // while that half is made durable (and sent again elsewhere).
            self.check_append(now, &b)?;
            self.check_append(now, &scope)?;
            self.append_local(now, &b, mutation.clone())?;
        }
        self.append_local(now, &scope, mutation)
    }

    /// Refuses a write that would take its row past [`Limits::row_bytes_max`]
    /// (`Error::TooLarge` naming the row's size after it and the limit). Only
    /// writes that add cells can; the row is read only when the sum of what it
    /// holds and what the write adds exceeds the limit, and then the write is
    /// applied to a copy (as the newest version, so it replaces what it would) and
    /// the copy measured.
    fn check_row_size(&self, m: &RowMutation) -> Result<(), Error> {
        let adds = |x: &Mutation| {
            matches!(
                x,
                Mutation::SetCell { .. } | Mutation::MergeRow(_) | Mutation::Increment { .. }
            )
        };
        if !m.mutations().iter().any(adds) {
            return Ok(());
        }
        let max = self.config.limits.row_bytes_max;
        let (table, key) = (m.table(), m.row_key());
        let added = m.payload_bytes() - key.len();
        if added.saturating_add(self.storage.row_value_bytes(table, key)?) <= max {
            return Ok(());
        }
        let mut row = self.storage.get_row(table, key)?.unwrap_or_default();
        let version = Version::new(Timestamp::MAX, self.id.clone());
        let schema = self.deployment.placement.schema.table(table);
        row.apply(&version, m.mutations(), schema);
        Limits::check(Limited::Row, row.value_bytes(), max)
    }

    /// The wall time (ms) of the latest clock reading a write proposed now can be
    /// logged at: the second reading from here (a migrating row's write takes
    /// two). An event time is checked against it, so that it is within its
    /// table's window of the clock time it is logged at, whichever that is.
    fn stamp_ms_bound(&self, now: Now) -> u64 {
        let first = Timestamp::new(now.wall_ms, 0).max(self.clock.last().successor());
        first.successor().wall_ms()
    }

    /// A local write into one given scope's stream: the row's own scope, or the
    /// scope a migration moves it to (backfill writes there only).
    pub fn propose_in(
        &mut self,
        now: Now,
        scope: &ScopeId,
        mutation: RowMutation,
    ) -> Result<Token, Error> {
        mutation.check_schema(&self.deployment.placement.schema)?;
        mutation.check_event_time(&self.deployment.placement.schema, self.stamp_ms_bound(now))?;
        if &**mutation.table() == LOCATION_TABLE {
            crate::location::check_location_write(&mutation, &self.deployment)?;
        }
        self.check_row_size(&mutation)?;
        let (table, key) = (mutation.table(), mutation.row_key());
        let allowed = self.scope_of(table, key) == *scope
            || self.location.migrating_scope(&self.deployment, table, key) == Some(scope);
        if !allowed {
            return Err(Error::PolicyForbids {
                scope: scope.to_string(),
                replica: self.id.to_string(),
            });
        }
        self.append_local(now, scope, mutation)
    }

    /// `Some` when this replica's clock is fenced: more than half of the origins it
    /// heard from in the last [`CLOCK_FENCE_WINDOW_US`] (at least two of them) stamp
    /// heartbeats more than `max_offset` *ahead* of its own clock (each peer's
    /// freshest reading in the window: see `PeerClock`). Its clock is then the odd
    /// one out, far behind, and [`Replica::propose`] refuses writes with this error:
    /// stamped in everyone else's past, they would lose to older writes. A clock far
    /// *ahead* is not fenced here (late heartbeats would look the same); its peers
    /// refuse its timestamps instead (I1), so its writes wait until real time reaches
    /// them. With a single peer heard nobody can tell which clock is wrong: no fence.
    pub fn clock_fence(&self, now: Now) -> Option<ClockError> {
        let max = self.clock.max_offset_ms();
        let mut heard = 0usize;
        let mut off: Vec<i64> = Vec::new();
        for c in self.peer_clocks.values() {
            let Some(offset_ms) = c.offset(now.mono_us) else {
                continue;
            };
            heard += 1;
            // Only peers reading *ahead*: lateness can make a peer read behind, never
            // ahead, so this direction is never a false alarm. (A clock far ahead
            // is handled by its peers, which refuse its timestamps: I1.)
            if offset_ms > 0 && offset_ms.unsigned_abs() > max {
                off.push(offset_ms);
            }
        }
        if heard < 2 || off.len() * 2 <= heard {
            return None;
        }
        off.sort_unstable();
        Some(ClockError::Fenced {
            offset_ms: -off[off.len() / 2],
            peers_off: off.len(),
            peers_heard: heard,
            window_s: CLOCK_FENCE_WINDOW_US / 1_000_000,
            max_offset_ms: max,
        })
    }

    fn append_local(
        &mut self,
        now: Now,
        scope: &ScopeId,
        mutation: RowMutation,
    ) -> Result<Token, Error> {
        self.check_append(now, scope)?;
        let timestamp = self.clock.now(now.wall_ms);
        let sequence = self.stream_mut(scope, &self.id.clone()).applied.sequence + 1;
        let entry = LogEntry {
            scope: scope.clone(),
            origin: self.id.clone(),
            sequence,
            timestamp,
            mutation,
        };
        self.apply_entry(now, &entry)?;
        self.unflushed.push(entry);
        Ok(Token {
            scope: scope.clone(),
            origin: self.id.clone(),
            sequence,
            timestamp,
        })
    }

    /// Whether a local write may be appended to `scope`'s own stream now: the
    /// clock is not fenced, this replica stores the scope's rows, and it knows its
    /// own stream there.
    fn check_append(&self, now: Now, scope: &ScopeId) -> Result<(), Error> {
        if let Some(fence) = self.clock_fence(now) {
            return Err(Error::Clock(fence));
        }
        if !self.stores_rows || !self.scopes.contains_key(scope) {
            return Err(Error::PolicyForbids {
                scope: scope.to_string(),
                replica: self.id.to_string(),
            });
        }
        if self.relearning.contains_key(scope) {
            return Err(Error::OwnStreamUnknown {
                scope: scope.to_string(),
                replica: self.id.to_string(),
            });
        }
        Ok(())
    }

    /// Makes everything applied so far durable (one `Storage::sync`), then
    /// acknowledges and sends local writes and advertises the new watermarks.
    pub fn flush(&mut self, now: Now) -> Result<(), Error> {
        // Heartbeat-advanced watermark timestamps go to storage first (I6: an
        // advertised watermark never goes backwards, across restarts too).
        // In scope order, then origin order, as a walk over every stream would go.
        // One walk: each moved stream's dirty watermark joins the batch, and what it
        // has applied is taken as durable at once (noted in `advanced`); the events
        // follow the sync. If the write or the sync fails, `unflush` puts the
        // streams back.
        self.moved.sort_unstable();
        let mut batch = WriteBatch::default();
        let mut advanced = std::mem::take(&mut self.advanced);
        for (i, (scope, origin)) in self.moved.iter().enumerate() {
            let Some(s) = self.scopes.get_mut(scope) else {
                continue;
            };
            let Some(st) = s.streams.get_mut(origin) else {
                continue;
            };
            if st.dirty {
                batch
                    .watermarks
                    .push((scope.clone(), origin.clone(), st.applied));
                st.dirty = false;
            }
            st.listed = false;
            if st.durable != st.applied {
                let wm = st.applied;
                advanced.push((i, st.durable, wm));
                st.durable = wm;
                set_mark(&s.origins, &mut s.durable_marks, origin, wm);
            }
        }
        let written = if batch.is_empty() {
            Ok(())
        } else {
            self.storage.write(batch)
        }
        .and_then(|()| self.storage.sync());
        if let Err(e) = written {
            self.unflush(&advanced);
            advanced.clear();
            self.advanced = advanced;
            return Err(e.into());
        }
        let mut next = advanced.iter().peekable();
        for (i, (scope, origin)) in self.moved.drain(..).enumerate() {
            if let Some((_, _, wm)) = next.next_if(|(j, _, _)| *j == i) {
                self.events.push_back(Event::WatermarkAdvanced {
                    scope,
                    origin,
                    watermark: *wm,
                });
            }
        }
        advanced.clear();
        self.advanced = advanced;
        #[cfg(debug_assertions)]
        for s in self.scopes.values() {
            for (origin, st) in &s.streams {
                debug_assert!(
                    !st.dirty && st.durable == st.applied && !st.listed,
                    "{}: the stream of {origin} moved without being listed for flush",
                    self.id
                );
            }
        }
        for entry in std::mem::take(&mut self.unflushed) {
            self.events.push_back(Event::Committed(Token {
                scope: entry.scope.clone(),
                origin: entry.origin.clone(),
                sequence: entry.sequence,
                timestamp: entry.timestamp,
            }));
            self.forward(now, &entry, None);
        }
        Ok(())
    }

    /// Undoes a flush whose write or sync failed: the moved streams stay listed
    /// for the next flush, and their durable watermarks go back (`advanced`: the
    /// position in `moved`, the durable watermark before, the one taken).
    #[cold]
    fn unflush(&mut self, advanced: &[(usize, Watermark, Watermark)]) {
        for (scope, origin) in &self.moved {
            if let Some(st) = stream_of(&mut self.scopes, scope, origin) {
                st.listed = true;
            }
        }
        for (i, before, _) in advanced {
            let (scope, origin) = &self.moved[*i];
            if let Some(s) = self.scopes.get_mut(scope) {
                s.set_durable(origin, *before);
            }
        }
    }
}
