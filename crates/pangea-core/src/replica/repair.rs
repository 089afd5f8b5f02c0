//! Gap repair: asking a neighbour for a missing range of a stream (the round
//! trips that pace it), queueing frames for peers, and answering requests from the
//! retained log.

use super::*;

impl<S: Storage> Replica<S> {
    /// Asks a peer for the missing part of a stream, unless a request is in flight.
    pub(super) fn maybe_request_gap(&mut self, now: Now, scope: &ScopeId, origin: &ReplicaId) {
        let retry_us = self.config.gap_retry_ms * 1_000;
        let gap_max = self.config.gap_entries_max as u64;
        let Some(s) = self.scopes.get(scope) else {
            return;
        };
        if s.incoming.is_some() {
            return; // a snapshot is on its way
        }
        let Some(st) = s.streams.get(origin) else {
            return;
        };
        let from = st.applied.sequence + 1;
        let first_pending = st.pending.keys().next().copied();
        let last = match first_pending {
            Some(p) => p - 1,
            None => st.known_last,
        };
        if last < from {
            return;
        }
        let grace_us = self.config.gap_grace_ms * 1_000;
        match st.behind_since_us {
            None => {
                self.stream_mut(scope, origin).behind_since_us = Some(now.mono_us);
                return;
            }
            Some(t) if st.gap.is_none() && now.mono_us < t + grace_us => return,
            Some(_) => {}
        }
        let (attempt, unanswered) = match &st.gap {
            // Wait at least two round trips to the peer asked before asking another,
            // and twice as long after each request that went unanswered.
            Some(g)
                if now.mono_us
                    < g.at_us
                        + (retry_us.max(2 * self.rtt_us(&g.asked)) << g.unanswered.min(3)) =>
            {
                return;
            }
            Some(g) => (g.attempt + 1, g.unanswered + 1),
            None => (0, 0),
        };
        // Candidates: the hint (it sent us something later, so it applied this), tree
        // neighbours, the origin, then any live member that stores the scope.
        let mut candidates: Vec<ReplicaId> = Vec::new();
        candidates.extend(st.hint.iter().cloned());
        candidates.extend(s.forward_set(&self.id).cloned());
        candidates.push(origin.clone());
        candidates.extend(s.members.iter().cloned());
        let mut seen = BTreeSet::new();
        candidates.retain(|c| {
            *c != self.id
                && seen.insert(c.clone())
                && !self.peers.get(c).is_some_and(|p| p.suspected)
        });
        if candidates.is_empty() {
            return;
        }
        let asked = candidates[attempt as usize % candidates.len()].clone();
        let to = last.min(from + gap_max - 1);
        let st = self.stream_mut(scope, origin);
        st.gap = Some(GapInFlight {
            asked: asked.clone(),
            at_us: now.mono_us,
            attempt,
            unanswered,
        });
        self.stats.gap_requests += 1;
        self.events.push_back(Event::GapDetected {
            scope: scope.clone(),
            origin: origin.clone(),
            from,
            to,
        });
        self.queue_frame(
            &asked,
            Frame::GapRequest(GapRequest {
                scope: scope.clone(),
                origin: origin.clone(),
                from,
                to,
            }),
        );
    }

    /// The topology's round-trip estimate to a peer.
    fn rtt_us(&self, peer: &ReplicaId) -> u64 {
        (self
            .deployment
            .topology
            .rtt_ms(&self.id, peer)
            .unwrap_or(0.0)
            * 1_000.0) as u64
    }

    pub(super) fn queue_frame(&mut self, to: &ReplicaId, frame: Frame) {
        if let Some(p) = self.peers.get_mut(to) {
            p.frames.push_back(frame);
        }
    }

    #[cold]
    pub(super) fn handle_gap_request(
        &mut self,
        from: &ReplicaId,
        g: GapRequest,
    ) -> Result<(), Error> {
        let Some(s) = self.scopes.get(&g.scope) else {
            self.reject(from, Reject::UnknownScope);
            return Ok(());
        };
        if !s.members.contains(from) {
            self.reject(from, Reject::NotInScope);
            return Ok(());
        }
        // An answer to this peer still waits to leave: a new one would queue
        // behind it, a copy of what is on its way. (Not refused for a link busy
        // with mutations: the fill is what lets the peer apply them.) The
        // requester asks again after its wait.
        if self
            .peers
            .get(from)
            .is_some_and(|p| p.frames.iter().any(|f| matches!(f, Frame::GapFill(_))))
        {
            return Ok(());
        }
        // Only the watermarks (cloning the stream would copy its reorder buffer).
        let (applied, durable) = s
            .streams
            .get(&g.origin)
            .map(|st| (st.applied, st.durable))
            .unwrap_or_default();
        // Our own writes leave only once durable; others' as soon as applied.
        let upto = if g.origin == self.id {
            durable.sequence
        } else {
            applied.sequence
        };
        let to = g.to.min(upto);
        let entries = if to >= g.from {
            let n = ((to - g.from + 1) as usize).min(self.config.gap_entries_max);
            self.storage.read_log(
                &g.scope,
                &g.origin,
                g.from,
                n,
                self.config.gap_fill_bytes_max,
            )?
        } else {
            Vec::new()
        };
        let log_start = match self.storage.log_bounds(&g.scope, &g.origin)? {
            Some((first, _)) => first,
            // No log at all: everything up to our watermark is gone from it.
            None => applied.sequence + 1,
        };
        self.queue_frame(
            from,
            Frame::GapFill(GapFill {
                scope: g.scope,
                origin: g.origin,
                entries,
                log_start,
            }),
        );
        Ok(())
    }

    #[cold]
    pub(super) fn handle_gap_fill(
        &mut self,
        now: Now,
        from: &ReplicaId,
        g: GapFill,
    ) -> Result<(), Error> {
        if !self.scopes.contains_key(&g.scope) {
            self.reject(from, Reject::UnknownScope);
            return Ok(());
        }
        let (scope, origin) = (g.scope.clone(), g.origin.clone());
        let wanted = self.scopes[&scope]
            .streams
            .get(&origin)
            .map_or(1, |st| st.applied.sequence + 1);
        let filled = g.entries.iter().any(|e| e.sequence == wanted);
        // A late copy of an answer already applied says nothing about the request
        // in flight now: it must not make us ask again at once.
        let stale = g.entries.last().is_some_and(|e| e.sequence < wanted);
        for e in g.entries {
            self.accept(now, from, e)?;
        }
        let stores_rows = self
            .deployment
            .topology
            .replicas
            .get(from)
            .is_some_and(|r| r.role.stores_rows());
        if !filled && g.log_start > wanted && stores_rows {
            // The peer no longer has what we miss — whether or not it is the peer we
            // are waiting on now (a slow answer still tells the truth): take a
            // snapshot from it.
            self.stream_mut(&scope, &origin).gap = None;
            self.request_snapshot(now, &scope, from);
            return self.drain_pending(now, &scope, &origin);
        }
        let st = self.stream_mut(&scope, &origin);
        if !stale && st.gap.as_ref().is_some_and(|gap| &gap.asked == from) {
            let attempt = st.gap.as_ref().map_or(0, |gap| gap.attempt);
            st.gap = None;
            if !filled {
                // It did not have it yet; try someone else soon.
                // Half the retry delay, not zero: late answers from several peers
                // must not each fire a new request at once.
                let soon_us = now.mono_us.saturating_sub(self.config.gap_retry_ms * 500);
                let st = self.stream_mut(&scope, &origin);
                st.gap = Some(GapInFlight {
                    asked: from.clone(),
                    at_us: soon_us,
                    attempt,
                    unanswered: 0,
                });
            }
        }
        self.drain_pending(now, &scope, &origin)
    }
}
