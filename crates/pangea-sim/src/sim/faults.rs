//! The fault timeline, the end of the workload, and convergence.

use super::*;
use pangea_core::location::{LOCATION_TABLE, Location};

impl Simulation {
    pub(super) fn fault_start(&mut self, i: usize) {
        if !self.workload_on || self.faults[i].started {
            return;
        }
        self.faults[i].started = true;
        let f: Fault = self.sc.faults[i].clone();
        self.trace([50, i as u64, 0, 0]);
        tracing::debug!(at = %self.now, fault = %f.label, "fault starts");
        match &f.kind {
            FaultKind::Lose {
                replicas,
                regions,
                silent,
            } => {
                for id in replicas {
                    if let Some(r) = self.names.get(id.as_str()) {
                        self.nodes[r].silent += u32::from(*silent);
                        self.take_down(r);
                    }
                }
                for region in regions {
                    if let Some(ri) = self.net.region_idx(region) {
                        self.region_lost[ri] += 1;
                    }
                }
                // The region's frontends die with it: what they had in flight
                // ends unanswered and is counted by no one.
                if !regions.is_empty() {
                    let lost = &self.region_lost;
                    let clients = &self.clients;
                    let gone = self
                        .ops
                        .remove_where(|op| lost[clients[op.client].region] > 0);
                    self.metrics.counters.ops_lost_with_frontends += gone;
                }
            }
            FaultKind::Partition { a, b, one_way } => match self.net.partition(a, b, *one_way) {
                Ok(id) => self.faults[i].partition = Some(id),
                Err(e) => self.checks.violation(format!("fault {}: {e}", f.label)),
            },
            FaultKind::DegradeLink { a, b, link } => {
                for x in a {
                    for y in b {
                        if let Err(e) = self.net.degrade_link(x, y, *link) {
                            self.checks.violation(format!("fault {}: {e}", f.label));
                        }
                    }
                }
            }
            FaultKind::ClockSkew {
                replicas,
                offset_ms,
            } => {
                for id in replicas {
                    if let Some(r) = self.names.get(id.as_str()) {
                        self.nodes[r].skew_ms += offset_ms;
                    }
                }
            }
            FaultKind::Pause { replicas } => {
                for id in replicas {
                    if let Some(r) = self.names.get(id.as_str()) {
                        self.nodes[r].paused += 1;
                    }
                }
            }
            FaultKind::Slow { replicas, factor } => {
                for id in replicas {
                    if let Some(r) = self.names.get(id.as_str()) {
                        self.nodes[r].host.scale(*factor);
                    }
                }
            }
            FaultKind::ChangePlacement { rollout, .. } => {
                // Views are numbered in fault order from 1 (see `Simulation::new`).
                let view = 1 + self.sc.faults[..i]
                    .iter()
                    .filter(|f| matches!(f.kind, FaultKind::ChangePlacement { .. }))
                    .count();
                let mut order: Vec<usize> = (0..self.nodes.len()).collect();
                for k in (1..order.len()).rev() {
                    let j = self.fault_rng.next_below(k + 1);
                    order.swap(k, j);
                }
                self.faults[i].order = order;
                self.faults[i].view = view;
                self.client_view = view;
                let n = self.nodes.len() as u64;
                for step in 0..self.nodes.len() {
                    let at =
                        self.now + SimDuration::from_us(rollout.as_us() * step as u64 / n.max(1));
                    self.queue.push(
                        at,
                        Ev::Rollout {
                            fault: i as u32,
                            step: step as u32,
                        },
                    );
                }
            }
            FaultKind::Migrate {
                table,
                prefix,
                to,
                home,
            } => self.start_migration(i, table, prefix, to, home),
            FaultKind::Backup {
                region,
                app_profile,
                policies,
                deadline,
            } => self.start_backup(i, region, app_profile, policies, *deadline),
        }
        self.release_dropped();
        let permanent = matches!(
            f.kind,
            FaultKind::ChangePlacement { .. }
                | FaultKind::ClockSkew { .. }
                | FaultKind::Migrate { .. }
                | FaultKind::Backup { .. }
        ) && f.duration.is_none();
        if permanent {
            self.faults[i].ended = true;
        } else if let Some(d) = f.duration
            && self.shard.is_none()
        {
            // (Split, the coordinator ends it.)
            self.queue.push(self.now + d, Ev::FaultEnd(i as u32));
        }
    }

    pub(super) fn fault_end(&mut self, i: usize) {
        let st = &mut self.faults[i];
        if !st.started || st.ended {
            return;
        }
        st.ended = true;
        let f: Fault = self.sc.faults[i].clone();
        self.trace([51, i as u64, 0, 0]);
        tracing::debug!(at = %self.now, fault = %f.label, "fault ends");
        match &f.kind {
            FaultKind::Lose {
                replicas,
                regions,
                silent,
            } => {
                for region in regions {
                    if let Some(ri) = self.net.region_idx(region) {
                        self.region_lost[ri] -= 1;
                    }
                }
                for id in replicas {
                    if let Some(r) = self.names.get(id.as_str()) {
                        self.nodes[r].silent -= u32::from(*silent);
                        self.bring_up(r);
                    }
                }
            }
            FaultKind::Slow { replicas, factor } => {
                for id in replicas {
                    if let Some(r) = self.names.get(id.as_str()) {
                        self.nodes[r].host.scale(1.0 / *factor);
                    }
                }
            }
            FaultKind::Partition { .. } => {
                if let Some(id) = self.faults[i].partition.take() {
                    self.net.heal(id);
                }
            }
            FaultKind::DegradeLink { a, b, .. } => {
                for x in a {
                    for y in b {
                        let _ = self.net.restore_link(x, y);
                    }
                }
            }
            FaultKind::ClockSkew {
                replicas,
                offset_ms,
            } => {
                for id in replicas {
                    if let Some(r) = self.names.get(id.as_str()) {
                        self.nodes[r].skew_ms -= offset_ms;
                    }
                }
            }
            FaultKind::Pause { replicas } => {
                for id in replicas {
                    if let Some(r) = self.names.get(id.as_str()) {
                        self.resume(r);
                    }
                }
            }
            FaultKind::ChangePlacement { .. }
            | FaultKind::Migrate { .. }
            | FaultKind::Backup { .. } => {}
        }
        // (Split, the coordinator measures catch-up over both shards.)
        if self.workload_on && self.shard.is_none() {
            self.start_catch_up();
        }
    }

    pub(super) fn rollout_step(&mut self, fault: usize, step: usize) {
        let st = &self.faults[fault];
        let (Some(&r), view) = (st.order.get(step), st.view) else {
            return;
        };
        let d = self.views[view].clone();
        let node = &mut self.nodes[r];
        node.view = view;
        let nw = node.now(self.now);
        if let Some(rep) = node.replica.as_mut() {
            rep.handle_view(nw, d);
            self.settle(r);
        }
        self.trace([52, fault as u64, r as u64, 0]);
    }

    /// Messages the network dropped in flight: release the senders' in-flight bytes.
    fn release_dropped(&mut self) {
        for dropped in self.net.take_dropped() {
            let (from, to) = (dropped.from.index(), dropped.to.index());
            let to_id = self.nodes[to].id.clone();
            let sender = &mut self.nodes[from];
            if sender.foreign {
                // Its shard releases the bytes with the next crossing (whatever life
                // sent them, as below: this shard does not know its lives).
                if let Some(ctx) = self.shard.as_mut() {
                    ctx.sent_back.push((from, to, dropped.bytes, None));
                }
            } else if let Some(rep) = sender.replica.as_mut() {
                rep.handle_sent(&to_id, dropped.bytes);
            }
            self.metrics.counters.messages_dropped += 1;
        }
    }

    /// A crash: unsynced writes are lost, the storage waits for the restart.
    fn take_down(&mut self, r: usize) {
        let node = &mut self.nodes[r];
        node.down += 1;
        if node.down > 1 {
            return;
        }
        if node.foreign {
            // Its shard crashes it; here only the network learns it is gone.
            let _ = self.net.set_down_idx(crate::net::ReplicaIdx::new(r), true);
            return;
        }
        let Some(rep) = node.replica.take() else {
            return;
        };
        // Its migration jobs go with the process; a restart resumes them.
        node.jobs.clear();
        let mut storage = rep.into_storage();
        storage.crash();
        node.parked = Some(storage);
        node.timer_gen += 1;
        node.timer_at = None;
        // Its process is gone: nothing held or queued for it survives.
        node.held_frames.clear();
        node.held_requests.clear();
        node.inbox.clear();
        node.inbox_gen += 1;
        node.turn = None;
        node.host.crash(self.now);
        let _ = self.net.set_down_idx(crate::net::ReplicaIdx::new(r), true);
        self.trace([53, r as u64, 0, 0]);
        // Writes it proposed and never committed are not acknowledged.
        self.pending_commits.retain(|k, _| k.0 as usize != r);
        self.replication_waits.retain(|w| w.r as usize != r);
        self.batch_waits.retain(|k, _| k.2 as usize != r);
    }

    /// A restart from the crashed storage (C3 across restarts).
    fn bring_up(&mut self, r: usize) {
        let node = &mut self.nodes[r];
        if node.down == 0 {
            return;
        }
        node.down -= 1;
        if node.down > 0 {
            return;
        }
        if node.foreign {
            let _ = self.net.set_down_idx(crate::net::ReplicaIdx::new(r), false);
            return;
        }
        let Some(storage) = node.parked.take() else {
            return;
        };
        node.life += 1;
        node.links.clear();
        let d = self.views[node.view].clone();
        let seed = replica_seed(self.sc.seed, r, node.life);
        let nw = node.now(self.now);
        let rep = match Replica::new(
            node.id.clone(),
            d,
            self.sc.replica.clone(),
            storage,
            seed,
            nw,
        ) {
            Ok(rep) => rep,
            Err(e) => {
                let id = node.id.clone();
                self.checks.other_violations += 1;
                self.checks.violation(format!("{id}: restart failed: {e}"));
                return;
            }
        };
        let restored = rep.storage().watermarks().unwrap_or_default();
        // Its store is trusted (it caught up before, or started with the cluster):
        // the gate listens, then catches up with what its peers say exists.
        let heartbeat = std::time::Duration::from_millis(rep.config().heartbeat_interval_ms);
        let at = std::time::Duration::from_micros(self.now.as_us());
        node.gate = Some(Box::new(Gate::new(at, heartbeat, true)));
        node.replica = Some(rep);
        let _ = self.net.set_down_idx(crate::net::ReplicaIdx::new(r), false);
        // C3: what survived must cover what was advertised; applied restarts there.
        let n = self.names.len();
        let mut survived = vec![0u64; self.checks.scopes * n];
        for (s, o, w) in restored {
            if let (Some(s), Some(o)) = (self.scopes.get(s.as_str()), self.names.get(o.as_str())) {
                survived[s * n + o] = w.sequence;
            }
        }
        for s in 0..self.checks.scopes {
            for o in 0..n {
                let k = self.checks.idx(r, s, o);
                let (adv, _) = self.checks.advertised[k];
                if survived[s * n + o] < adv {
                    self.checks.watermark_violations += 1;
                    let (id, sc, or) = (
                        self.nodes[r].id.clone(),
                        self.scopes.name(s).to_owned(),
                        self.names.name(o).to_owned(),
                    );
                    self.checks.violation(format!(
                        "C3: {id} restarted with {sc}/{or} at #{} below advertised #{adv}",
                        survived[s * n + o]
                    ));
                }
                self.checks.applied[k] = survived[s * n + o];
                let now_us = self.now.as_us();
                self.checks.note_durable(k, survived[s * n + o], now_us);
            }
        }
        self.trace([54, r as u64, 0, 0]);
        self.resume_jobs(r);
        self.settle(r);
    }

    fn resume(&mut self, r: usize) {
        let node = &mut self.nodes[r];
        if node.paused == 0 {
            return;
        }
        node.paused -= 1;
        if node.paused > 0 {
            return;
        }
        let frames: Vec<(usize, Wire, usize)> = node.held_frames.drain(..).collect();
        let requests = std::mem::take(&mut node.held_requests);
        // Timers fire late: as if the process had just been continued.
        node.timer_gen += 1;
        node.timer_at = None;
        let nw = node.now(self.now);
        if let Some(rep) = node.replica.as_mut() {
            let _ = rep.handle_timeout(nw);
        }
        self.settle(r);
        // What its host had queued goes on; what arrived while it was paused queues
        // behind it.
        self.schedule_inbox(r);
        for (from, wire, bytes) in frames {
            self.enqueue(from, r, wire.frame, bytes);
        }
        for ev in requests {
            self.handle(ev);
        }
        self.trace([55, r as u64, 0, 0]);
    }

    // ---- convergence --------------------------------------------------------------

    /// The durable set's highest sequence per stream (what every member must reach).
    pub(super) fn durable_targets(&self) -> Vec<u64> {
        self.checks.streams.iter().map(|v| v.len() as u64).collect()
    }

    fn start_catch_up(&mut self) {
        self.catch_up = Some(CatchUp {
            heal_at: self.now,
            targets: self.durable_targets(),
            done_at: None,
        });
        self.queue.push(self.now + CATCH_UP_CHECK, Ev::CatchUpCheck);
    }

    /// Whether every up replica storing each scope durably covers `targets`.
    pub(super) fn covers(&self, targets: &[u64]) -> bool {
        let d = &self.views[self.client_view];
        let n = self.names.len();
        for (s, scope) in self.scope_ids.iter().enumerate() {
            if d.placement.policy(scope).is_none() {
                continue;
            }
            for (r, node) in self.nodes.iter().enumerate() {
                if !node.stores_rows || !self.allowed[self.client_view][s][r] {
                    continue;
                }
                let Some(rep) = node.replica.as_ref() else {
                    continue; // down: it cannot catch up until it is back
                };
                let Some(wm) = rep.watermarks(scope) else {
                    return false;
                };
                for o in 0..n {
                    let t = targets[s * n + o];
                    if t > 0 && wm.get(&self.nodes[o].id).sequence < t {
                        return false;
                    }
                }
            }
        }
        true
    }

    pub(super) fn on_catch_up_check(&mut self) {
        let Some(c) = &self.catch_up else { return };
        if c.done_at.is_some() {
            return;
        }
        if self.covers(&c.targets) {
            let now = self.now;
            if let Some(c) = self.catch_up.as_mut() {
                c.done_at = Some(now);
            }
        } else if self.workload_on || self.drain_started.is_some() {
            self.queue.push(self.now + CATCH_UP_CHECK, Ev::CatchUpCheck);
        }
    }

    /// The end of the safety phase: stop the workload, heal everything.
    pub(super) fn on_end_workload(&mut self) {
        let had_heal_inside = self.catch_up.is_some();
        self.end_workload_here();
        if !had_heal_inside {
            // No heal inside the workload phase: measure catch-up from this one.
            self.catch_up = Some(CatchUp {
                heal_at: self.now,
                targets: self.durable_targets(),
                done_at: None,
            });
            self.queue.push(self.now, Ev::CatchUpCheck);
        } else if self.catch_up.as_ref().is_some_and(|c| c.done_at.is_none()) {
            self.queue.push(self.now, Ev::CatchUpCheck);
        }
        self.queue.push(self.now + DRAIN_CHECK, Ev::DrainCheck);
    }

    /// The end of the safety phase, in this run (or shard): the workload stops,
    /// every fault heals.
    pub(super) fn end_workload_here(&mut self) {
        self.workload_on = false;
        self.trace([56, 0, 0, 0]);
        for i in 0..self.faults.len() {
            if self.faults[i].started && !self.faults[i].ended {
                self.fault_end(i);
            }
        }
        // Anything down or paused by overlapping faults is back now.
        for r in 0..self.nodes.len() {
            while self.nodes[r].down > 0 {
                self.bring_up(r);
            }
            while self.nodes[r].paused > 0 {
                self.resume(r);
            }
        }
        self.net.heal_all();
        self.net.restore_all_links();
        self.region_lost.iter_mut().for_each(|x| *x = 0);
        self.drain_started = Some(self.now);
    }

    pub(super) fn on_drain_check(&mut self) {
        let targets = self.durable_targets();
        if self.covers(&targets) && self.backups_finished() {
            match self.digests_agree() {
                Ok(()) => {
                    // The run stops here: a catch-up not yet seen done is done now
                    // (its targets are at most today's), even if its own check
                    // comes later in this same instant.
                    let now = self.now;
                    if let Some(c) = self.catch_up.as_mut().filter(|c| c.done_at.is_none()) {
                        c.done_at = Some(now);
                    }
                    self.final_convergence = Some(self.now);
                    self.stop = true;
                    return;
                }
                Err(why) => {
                    // Equal watermarks with unequal rows: waiting will not help.
                    self.checks.other_violations += 1;
                    self.checks.violation(format!("C5: {why}"));
                    self.stop = true;
                    return;
                }
            }
        }
        self.queue.push(self.now + DRAIN_CHECK, Ev::DrainCheck);
    }

    /// C5: every replica storing a scope has the same content digest as the oracle.
    pub(super) fn digests_agree(&self) -> std::result::Result<(), String> {
        self.digests_agree_with(&self.checks.oracle)
    }

    /// [`Self::digests_agree`] against `oracle`, for the replicas this run (or
    /// shard) runs.
    pub(super) fn digests_agree_with(
        &self,
        oracle_rows: &BTreeMap<(Arc<str>, Bytes), RowState>,
    ) -> std::result::Result<(), String> {
        let (oracle, location) = self.oracle_digests(oracle_rows);
        self.replicas_match(&oracle, &location)
    }

    /// The digest of each scope's rows in `oracle_rows`, by scope index, and the
    /// location metadata they hold (rows classified by it: a migration moves rows
    /// between scopes).
    pub(super) fn oracle_digests(
        &self,
        oracle_rows: &BTreeMap<(Arc<str>, Bytes), RowState>,
    ) -> (Vec<ContentDigest>, Location) {
        let d = &self.views[self.client_view];
        let schema = &d.placement.schema;
        let now_ms = self.now_wall_ms();
        let mut location = Location::new();
        for ((table, key), row) in oracle_rows {
            if &**table == LOCATION_TABLE {
                location.apply_row(d, key, Some(row));
            }
        }
        let mut oracle = vec![ContentDigest::new(); self.scopes.len()];
        for ((table, key), row) in oracle_rows {
            if let Some(s) = self.scope_index(&location, table, key) {
                oracle[s].add(schema, table, key, row, now_ms);
            }
        }
        (oracle, location)
    }

    /// A row's scope, by index: its location entry's policy, else the newest
    /// deployment's.
    pub(super) fn scope_index(
        &self,
        location: &Location,
        table: &str,
        key: &[u8],
    ) -> Option<usize> {
        let d = &self.views[self.client_view];
        if location.is_empty() {
            self.scopes.get(d.scope_of(table, key).as_str())
        } else {
            self.scopes.get(location.scope_of(d, table, key).as_str())
        }
    }

    /// C5 for the replicas this run (or shard) runs, against `oracle`'s digests,
    /// rows classified by `location`; and I10 at rest: no replica still holds a
    /// row a migration's flip moved to a policy without it.
    pub(super) fn replicas_match(
        &self,
        oracle: &[ContentDigest],
        location: &Location,
    ) -> std::result::Result<(), String> {
        let d = &self.views[self.client_view];
        let schema = &d.placement.schema;
        let now_ms = self.now_wall_ms();
        let ns = self.scopes.len();
        // Replicas of one run share the rows they agree on (`MemStorage::share_rows`):
        // a shared row met before, at the same address under the same table and key,
        // has the same scope and digest, so each is worked out once, not once per
        // replica. Rows held by one store alone are not remembered. A B-tree, not a
        // hash table: the table's doublings, made at the run's peak, raised the peak
        // RSS by 12 MiB (fresh huge pages); small nodes fit pages already in use.
        type Seen<'a> = BTreeMap<usize, (&'a str, &'a Bytes, Option<usize>, Option<u128>)>;
        let mut seen: Seen<'_> = BTreeMap::new();
        for (r, node) in self.nodes.iter().enumerate() {
            if !node.stores_rows || node.foreign {
                continue;
            }
            let Some(rep) = node.replica.as_ref() else {
                return Err(format!("{} is down", node.id));
            };
            let mut mine = vec![ContentDigest::new(); ns];
            for (table, key, row) in rep.storage().row_arcs() {
                if !location.is_empty()
                    && let Some(e) = location.lookup(table, key)
                    && e.migrating_to.is_none()
                    && !d.allowed(&node.id, d.group_scope(&e.policy, table, key))
                {
                    return Err(format!(
                        "{}: holds a row of {table} under {} that a migration moved to \
                         policy {}, which does not include it (I10 at rest)",
                        node.id,
                        pangea_core::redact::RedactedKey(&e.prefix),
                        e.policy
                    ));
                }
                if Arc::strong_count(row) == 1 {
                    // Held here alone: met once.
                    if let Some(s) = self.scope_index(location, table, key) {
                        mine[s].add(schema, table, key, row, now_ms);
                    }
                    continue;
                }
                let at = Arc::as_ptr(row) as usize;
                let (scope, digest) = match seen.get(&at) {
                    Some(&(t, k, scope, digest)) if t == &**table && k == key => (scope, digest),
                    _ => {
                        let scope = self.scope_index(location, table, key);
                        let digest = row.visible_digest(key, schema.table(table), now_ms);
                        seen.insert(at, (table, key, scope, digest));
                        (scope, digest)
                    }
                };
                if let Some(s) = scope {
                    mine[s].add_visible(table, digest);
                }
            }
            for s in 0..ns {
                if !self.allowed[self.client_view][s][r] {
                    continue;
                }
                if mine[s].finish() != oracle[s].finish() {
                    return Err(format!(
                        "{}: digest of scope {} differs from the oracle ({} vs {} rows)",
                        node.id,
                        self.scopes.name(s),
                        mine[s].rows(),
                        oracle[s].rows()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Adds a C5 violation naming a replica that is behind, with its state.
    pub(super) fn explain_not_converged(&mut self) {
        let targets = self.durable_targets();
        let d = self.views[self.client_view].clone();
        let n = self.names.len();
        let mut why = String::from("not converged within the drain limit");
        'outer: for (s, scope) in self.scope_ids.iter().enumerate() {
            for (r, node) in self.nodes.iter().enumerate() {
                if !node.stores_rows || !self.allowed[self.client_view][s][r] {
                    continue;
                }
                let Some(rep) = node.replica.as_ref() else {
                    continue;
                };
                let wm = rep.watermarks(scope);
                for o in 0..n {
                    let t = targets[s * n + o];
                    let have = wm.as_ref().map_or(0, |w| w.get(&self.nodes[o].id).sequence);
                    if t > have {
                        why = format!(
                            "{}: {scope}/{} at #{have} < #{t}\n{}",
                            node.id,
                            self.nodes[o].id,
                            rep.debug_state()
                        );
                        // And every other member's view of the scope.
                        for (k, other) in self.nodes.iter().enumerate() {
                            if k != r
                                && self.allowed[self.client_view][s][k]
                                && let Some(orep) = other.replica.as_ref()
                            {
                                why += &orep.debug_state();
                            }
                        }
                        break 'outer;
                    }
                }
            }
        }
        let _ = d;
        self.checks.other_violations += 1;
        self.checks.violation(format!("C5: {why}"));
    }
}
