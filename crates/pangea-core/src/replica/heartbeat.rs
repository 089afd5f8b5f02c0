//! Heartbeats: each origin's promise, its applied-watermark reports (periodic, or
//! at once when an origin asks), what a replica learns from its peers' heartbeats,
//! and relaying them along the trees.

use super::*;

impl<S: Storage> Replica<S> {
    fn own_heartbeat(&mut self, now: Now, scope: &ScopeId) -> Option<Heartbeat> {
        let periodic = self
            .heartbeats_sent
            .is_multiple_of(self.config.applied_gossip_every.max(1));
        let gossip = self.answer_report_requests(scope) || periodic;
        // The promise: nothing after `durable` will carry a timestamp at or below
        // this. Unflushed local writes (not yet sent) already have timestamps, so
        // promise only below the first of them (I7).
        let first_unflushed = self
            .unflushed
            .iter()
            .filter(|e| &e.scope == scope)
            .map(|e| e.timestamp)
            .min();
        let relearning = self.relearning.contains_key(scope);
        let timestamp = match first_unflushed {
            Some(t) => Timestamp::from_u64(t.as_u64().saturating_sub(1)),
            // Relearning, we do not know what our stream holds: promise nothing
            // beyond what we hold.
            None if relearning => self
                .scopes
                .get(scope)
                .and_then(|s| s.streams.get(&self.id))
                .map_or(Timestamp::ZERO, |st| st.durable.timestamp),
            None => self.clock.now(now.wall_ms),
        };
        // Our own watermark moves with our promise: we have applied all our writes,
        // and none will come at or below it. Written at the next flush (I6).
        if self.stores_rows && !relearning {
            let id = self.id.clone();
            if let Some(st) = self
                .scopes
                .get_mut(scope)
                .map(|s| s.streams.get_or_default(&id))
                && timestamp > st.applied.timestamp
            {
                st.applied.timestamp = timestamp;
                st.dirty = true;
                list_moved(&mut self.moved, st, scope, &self.id);
            }
        }
        let s = self.scopes.get(scope)?;
        let own = s
            .streams
            .get(&self.id)
            .map(|st| st.durable)
            .unwrap_or_default();
        let applied = if gossip {
            // Per origin the sequence applied, and one time for all: the scope's
            // low watermark. Receivers read a report's times only for the purge
            // horizon, a minimum over every entry, so it means what the entries'
            // own times would, and condenses to one number (`crate::link`).
            let low = s
                .durable_marks
                .iter()
                .map(|w| w.timestamp)
                .min()
                .unwrap_or_default();
            s.durable_watermarks()
                .map(|(o, w)| {
                    (
                        o,
                        Watermark {
                            sequence: w.sequence,
                            timestamp: low,
                        },
                    )
                })
                .collect()
        } else {
            Applied::default()
        };
        Some(Heartbeat {
            scope: scope.clone(),
            origin: self.id.clone(),
            sequence: own.sequence,
            timestamp: if self.stores_rows {
                timestamp.max(own.timestamp)
            } else {
                timestamp
            },
            applied,
            purge: s.purge_horizon,
            tree_edge: false,
            report_after: s.report_after,
        })
    }

    /// Whether this heartbeat must carry an applied-watermark report: an origin
    /// asked for one (`Heartbeat::report_after`) up to a sequence this replica now
    /// holds durably and has not reported yet. Marks those requests answered.
    fn answer_report_requests(&mut self, scope: &ScopeId) -> bool {
        let Some(s) = self.scopes.get_mut(scope) else {
            return false;
        };
        let mut due = false;
        for (origin, (asked, reported)) in &mut s.reports_asked {
            if *reported < *asked
                && s.streams
                    .get(origin)
                    .is_some_and(|st| st.durable.sequence >= *asked)
            {
                *reported = *asked;
                due = true;
            }
        }
        due
    }

    pub(super) fn send_heartbeats(&mut self, now: Now) {
        let scopes: Vec<ScopeId> = self.scopes.keys().cloned().collect();
        let probe = now.mono_us >= self.next_probe_us;
        if probe {
            self.next_probe_us = now.mono_us + self.config.probe_interval_ms * 1_000;
        }
        for scope in scopes {
            let Some(hb) = self.own_heartbeat(now, &scope) else {
                continue;
            };
            if !hb.applied.is_empty() {
                let mine = Report::from_sorted(hb.applied.to_vec());
                if let Some(s) = self.scopes.get_mut(&scope) {
                    s.applied_by.insert(self.id.clone(), mine);
                }
            }
            let s = &self.scopes[&scope];
            // Tree neighbours are told we hold them as neighbours: they adopt us as
            // inbound. Everyone else gets the heartbeat without that flag: inbound
            // neighbours (so two replicas that are neighbours in neither's tree do
            // not keep each other inbound by sending to each other), and suspected
            // members on a probe round (hearing us is what heals a cut tree, I8;
            // adopting every prober made each replica forward the backlog of a
            // healed partition to the whole other side at once).
            let edges = s.tree.neighbours(&self.id);
            let mut to: Vec<(ReplicaId, bool)> = s
                .inbound
                .keys()
                .filter(|n| !edges.contains(n))
                .map(|n| (n.clone(), false))
                .collect();
            if probe {
                to.extend(
                    s.members
                        .iter()
                        .filter(|m| {
                            !edges.contains(m)
                                && !s.inbound.contains_key(*m)
                                && self.peers.get(m).is_some_and(|p| p.suspected)
                        })
                        .map(|m| (m.clone(), false)),
                );
            }
            to.extend(edges.iter().map(|n| (n.clone(), true)));
            for (n, tree_edge) in to {
                if let Some(p) = self.peers.get_mut(&n) {
                    p.heartbeats.push(Heartbeat {
                        tree_edge,
                        ..hb.clone()
                    });
                }
            }
        }
        self.heartbeats_sent += 1;
    }

    pub(super) fn handle_heartbeats(
        &mut self,
        now: Now,
        from: &ReplicaId,
        hbs: Vec<Heartbeat>,
    ) -> Result<(), Error> {
        let inbound_until_us = now.mono_us + self.inbound_ttl_us();
        let window_us = self.gossip_window_us();
        // Scopes where a report moved the end of our own stream (relearning).
        let mut relearn_gaps: Vec<ScopeId> = Vec::new();
        // Streams of origins gone quiet whose end a report moved.
        let mut quiet_gaps: Vec<(ScopeId, ReplicaId)> = Vec::new();
        // Whether `from` is a member of the last scope looked at: a frame's
        // heartbeats come in scope order.
        let mut from_member: Option<(ScopeId, bool)> = None;
        for hb in hbs {
            let Some(mut s) = self.scopes.get_mut(&hb.scope) else {
                self.reject(from, Reject::UnknownScope);
                continue;
            };
            let from_ok = match &from_member {
                Some((scope, ok)) if *scope == hb.scope => *ok,
                _ => {
                    let ok = s.members.contains(from);
                    from_member = Some((hb.scope.clone(), ok));
                    ok
                }
            };
            if !from_ok || !s.members.contains(&hb.origin) {
                self.reject(from, Reject::NotInScope);
                continue;
            }
            let origin_is_writer = s.origins.contains(&hb.origin);
            if hb.origin == *from && hb.tree_edge {
                s.adopt(from, inbound_until_us);
            }
            if hb.origin == self.id {
                continue;
            }
            // What this origin's clock says against ours (a relayed heartbeat reads
            // a path's latency low: far below any max offset).
            let offset_ms = hb.timestamp.wall_ms() as i64 - now.wall_ms as i64;
            match self.peer_clocks.get_mut(&hb.origin) {
                Some(c) => c.record(offset_ms, now.mono_us),
                None => {
                    self.peer_clocks
                        .insert(&hb.origin, PeerClock::new(offset_ms, now.mono_us));
                }
            }
            if self.clock.observe(now.wall_ms, hb.timestamp).is_err() {
                self.reject(from, Reject::TimestampAhead);
                continue;
            }
            if note_heard(&mut self.peers, now, &hb.origin) {
                // Scopes are rebuilt: look ours up again, and membership.
                self.recovered(now, &hb.origin);
                from_member = None;
                s = self.scopes.get_mut(&hb.scope).expect("checked above");
            }
            if hb.report_after > 0 && origin_is_writer {
                let asked = s.reports_asked.entry(hb.origin.clone()).or_default();
                asked.0 = asked.0.max(hb.report_after);
            }
            if !hb.applied.is_empty() {
                match s.applied_by.get_mut(&hb.origin) {
                    Some(r) => r.raise(&hb.applied),
                    None => s
                        .applied_by
                        .entry(hb.origin.clone())
                        .or_default()
                        .raise(&hb.applied),
                }
                // Heard again after a silence: bounded reads hold it to what it
                // had from now on (`Replica::vouch`). Its first report of this
                // process's life is no reunion: heard since ever.
                let since = match s.reported_at.get(&hb.origin) {
                    Some((_, received_us))
                        if now.mono_us.saturating_sub(*received_us) > window_us =>
                    {
                        Some(Timestamp::new(now.wall_ms, 0))
                    }
                    Some(_) => None,
                    None => Some(Timestamp::ZERO),
                };
                if let Some(t) = since {
                    s.heard_since.insert(hb.origin.clone(), t);
                }
                let at = s
                    .reported_at
                    .entry(hb.origin.clone())
                    .or_insert((hb.timestamp, now.mono_us));
                if hb.timestamp >= at.0 {
                    *at = (hb.timestamp, now.mono_us);
                }
                // Writes of an origin gone quiet that the reporter has and we lack:
                // no heartbeat of that origin will announce them, so the report
                // does, and gap repair fetches them from the reporter.
                if origin_is_writer && hb.applied.len() == s.origin_ids.len() {
                    for (i, (o, w)) in hb.applied.iter().enumerate() {
                        let quiet = now
                            .wall_ms
                            .saturating_sub(s.durable_marks[i].timestamp.wall_ms())
                            > self.config.suspect_after_ms;
                        if quiet && *o == s.origin_ids[i] && *o != self.id && *o != hb.origin {
                            let st = s.streams.get_or_default(o);
                            if w.sequence > st.known_last {
                                st.known_last = w.sequence;
                                st.hint = Some(hb.origin.clone());
                                // Nothing of a quiet origin is in flight: no grace.
                                st.behind_since_us = Some(
                                    now.mono_us.saturating_sub(self.config.gap_grace_ms * 1_000),
                                );
                                quiet_gaps.push((hb.scope.clone(), o.clone()));
                            }
                        }
                    }
                }
                // The reporter is heard now: vouching holds only as of its report
                // (a reporter heard again may report from before the vouched
                // time), and for an origin it has writes of that this replica
                // lacks, only up to when it was heard again (`Replica::vouch`).
                // At once, not at the next round.
                if let Some(v) = &s.vouched {
                    let floor = s.created_floor;
                    let at = hb.timestamp.max(floor);
                    let heard_since = s
                        .heard_since
                        .get(&hb.origin)
                        .copied()
                        .unwrap_or(Timestamp::ZERO)
                        .max(floor);
                    let lacks = |i: usize| {
                        hb.applied
                            .iter()
                            .find(|(o, _)| *o == s.origin_ids[i])
                            .is_some_and(|(_, w)| w.sequence > s.durable_marks[i].sequence)
                    };
                    let lowered = |i: usize| -> Timestamp {
                        if v[i] <= floor || s.origin_ids[i] == hb.origin {
                            v[i]
                        } else if lacks(i) {
                            v[i].min(heard_since)
                        } else {
                            v[i].min(at)
                        }
                    };
                    if (0..v.len()).any(|i| lowered(i) != v[i]) {
                        let kept: Vec<Timestamp> = (0..v.len()).map(lowered).collect();
                        s.vouched = Some(kept.into());
                    }
                }
                if let Some(r) = self.relearning.get_mut(&hb.scope)
                    && origin_is_writer
                {
                    // How far another origin applied our own stream.
                    r.reported.insert(hb.origin.clone());
                    r.first_report_us.get_or_insert(now.mono_us);
                    let reported = hb
                        .applied
                        .iter()
                        .find(|(o, _)| *o == self.id)
                        .map_or(0, |(_, w)| w.sequence);
                    let st = s.streams.get_or_default(&self.id);
                    if reported > st.known_last {
                        st.known_last = reported;
                        st.hint = Some(hb.origin.clone());
                        relearn_gaps.push(hb.scope.clone());
                    }
                }
            }
            let st = s.streams.get_or_default(&hb.origin);
            // Only news travels on, so copies arriving over other paths stop here.
            let news = hb.timestamp > st.heartbeat.1 || hb.sequence > st.heartbeat.0;
            if !news {
                continue;
            }
            st.heartbeat = (
                st.heartbeat.0.max(hb.sequence),
                st.heartbeat.1.max(hb.timestamp),
            );
            // Whether the stream misses entries: `maybe_request_gap`'s first test,
            // made here so that a stream that misses nothing costs no lookups.
            let mut behind = false;
            if origin_is_writer {
                st.known_last = st.known_last.max(hb.sequence);
                if st.applied.sequence >= hb.sequence {
                    if hb.timestamp > st.applied.timestamp {
                        st.applied.timestamp = hb.timestamp;
                        st.dirty = true;
                        list_moved(&mut self.moved, st, &hb.scope, &hb.origin);
                    }
                } else {
                    st.hint = Some(from.clone());
                }
                let last = match st.pending.keys().next() {
                    Some(p) => p - 1,
                    None => st.known_last,
                };
                behind = last > st.applied.sequence;
            }
            // Relayed, it no longer comes from its origin.
            let hb = Heartbeat {
                tree_edge: false,
                ..hb
            };
            let i = match s
                .heartbeat_news
                .binary_search_by(|(h, _)| h.origin.cmp(&hb.origin))
            {
                Ok(i) => {
                    s.heartbeat_news[i] = (hb, from.clone());
                    i
                }
                Err(i) => {
                    s.heartbeat_news.insert(i, (hb, from.clone()));
                    i
                }
            };
            if self.forward_heartbeats_at_us.is_none() {
                self.forward_heartbeats_at_us =
                    Some(now.mono_us + self.config.heartbeat_forward_delay_ms * 1_000);
            }
            if behind {
                let hb = &s.heartbeat_news[i].0;
                let (scope, origin) = (hb.scope.clone(), hb.origin.clone());
                self.maybe_request_gap(now, &scope, &origin);
            }
        }
        let id = self.id.clone();
        for scope in relearn_gaps {
            self.maybe_request_gap(now, &scope, &id);
        }
        for (scope, origin) in quiet_gaps {
            self.maybe_request_gap(now, &scope, &origin);
        }
        Ok(())
    }

    pub(super) fn forward_heartbeat_news(&mut self) {
        // Each peer gets its heartbeats in scope order, then origin order: one
        // lookup per neighbour and scope, the scope's news walked per neighbour.
        for s in self.scopes.values_mut() {
            if s.heartbeat_news.is_empty() {
                continue;
            }
            for n in s.forward_set(&self.id) {
                let mut news = s
                    .heartbeat_news
                    .iter()
                    .filter(|(hb, came_from)| n != came_from && *n != hb.origin)
                    .peekable();
                if news.peek().is_none() {
                    continue;
                }
                if let Some(p) = self.peers.get_mut(n) {
                    p.heartbeats.extend(news.map(|(hb, _)| hb.clone()));
                }
            }
            s.heartbeat_news.clear();
        }
    }
}
