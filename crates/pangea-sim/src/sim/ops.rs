//! Client operations: issuing, routing (`plan_read`), the request's trip to a
//! replica and back, serving it there (`decide`, `MemStorage::row`, `propose`), and
//! the client's reaction to each answer: every decision is taken by
//! `pangea_core::frontend::call` (`ReadCall`, `WriteCall`), the state machines
//! `pangea-client`'s `read::run` and `mutate` drive too; this drives them on events
//! ([`Simulation::drive`], `Ev::Wake`).

use super::*;
use crate::scenario::WriteAck;
use crate::workload::{BatchRow, DrawnOp};
use pangea_core::frontend;
use pangea_core::frontend::HedgePolicy;
use pangea_core::frontend::call::{AttemptKind, Resend};
use pangea_core::read::{ReadOrder, RouteError, order_read_cached, staleness_ms, vouching_scope};
use pangea_topology::WriteRouting;
use std::time::Duration;

impl Simulation {
    /// One-way delay of client traffic between a client region and replica `r`
    /// (`to_replica` gives the direction); `None` while a partition cuts the path.
    pub(super) fn client_path(
        &mut self,
        region: usize,
        r: usize,
        to_replica: bool,
    ) -> Option<SimDuration> {
        let rr = self.nodes[r].region;
        let ps = if to_replica {
            self.net.path_state(region, rr)?
        } else {
            self.net.path_state(rr, region)?
        };
        if ps.cut {
            return None;
        }
        let cfg: &NetConfig = self.net.config();
        let latency = self.client_one_way_us[region][r] + ps.extra_latency_us;
        let jitter = if cfg.jitter_fraction > 0.0 && latency > 0 {
            self.path_rng
                .next_u64_inclusive((latency as f64 * cfg.jitter_fraction) as u64)
        } else {
            0
        };
        let mut loss_us = 0;
        if ps.loss > 0.0 {
            let rto = ((2 * latency) as f64 * cfg.rto_rtt_factor) as u64;
            let rto = rto.max(SimDuration::from_ms_f64(cfg.rto_min_ms).as_us());
            let mut lost = 0;
            while lost < cfg.retransmissions_max && self.path_rng.chance(ps.loss) {
                lost += 1;
                loss_us += rto;
            }
        }
        Some(SimDuration::from_us(latency + jitter + loss_us))
    }

    fn count_client_bytes(&mut self, region: usize, r: usize, bytes: usize) {
        if self.nodes[r].region != region {
            self.metrics.client_cross_region_bytes += bytes as u64;
        }
    }

    // ---- issuing --------------------------------------------------------------

    pub(super) fn on_issue(&mut self, region: usize) {
        if !self.workload_on {
            return;
        }
        let dt = self.generator.interarrival(self.region_rate[region]);
        self.queue.push(
            self.now + dt,
            Ev::Issue {
                region: region as u32,
            },
        );
        if self.region_lost[region] > 0 {
            return; // the region's frontends are gone with it
        }
        let clients = &self.region_clients[region];
        let client = clients[self.generator.pick(clients.len())];
        let drawn = match self.next_fill(region) {
            Some(op) => op,
            None => self
                .generator
                .draw(&self.region_prefix[region], &self.sc.workload.global_prefix),
        };
        let w = &self.sc.workload;
        let table = self.workload_table.clone();
        match drawn.kind {
            OpKind::Read(mode) => {
                let (key, consistency) = match mode {
                    Mode::Eventual => (drawn.key, Consistency::Eventual),
                    Mode::Affinity => (drawn.key, Consistency::RowAffinity),
                    Mode::Bounded => (
                        drawn.key,
                        Consistency::BoundedStaleness {
                            max_ms: w.bounded_ms,
                        },
                    ),
                    // Frontends' clocks are true (hosts' may be skewed).
                    Mode::AsOf => (
                        drawn.key,
                        Consistency::AsOf {
                            ms: super::wall_ms_at(self.now).saturating_sub(w.as_of_ms),
                        },
                    ),
                    Mode::Watermark => match &self.clients[client].last_write {
                        // Read-your-writes: the row of the client's last write.
                        Some((k, t)) => (k.clone(), Consistency::Watermark(t.clone())),
                        None => (drawn.key, Consistency::Eventual),
                    },
                };
                let mode = match consistency {
                    Consistency::Eventual => Mode::Eventual,
                    _ => mode,
                };
                self.start_read(client, mode, table, key, consistency, None);
            }
            OpKind::Write { column, value } => {
                let m = Mutation::SetCell {
                    family: w.family.as_str().into(),
                    column: Bytes::from(format!("c{column}")),
                    value,
                };
                self.start_write(client, table, drawn.key, m);
            }
            OpKind::Delete => self.start_write(client, table, drawn.key, Mutation::DeleteFromRow),
            OpKind::Increment { column } => {
                let m = Mutation::Increment {
                    family: w.counter_family.as_str().into(),
                    column: Bytes::from(format!("c{column}")),
                    delta: 1,
                };
                self.start_write(client, table, drawn.key, m);
            }
            OpKind::Batch(rows) => self.start_batch(client, table, rows),
        }
    }

    /// The region's next fill write (`RegionLoad::fill`), if it has rows left
    /// to write.
    fn next_fill(&mut self, region: usize) -> Option<DrawnOp> {
        let n = self.region_fill[region]?;
        let keys = self.generator.keys();
        let (prefix, rank) = if n < keys {
            (&self.region_prefix[region], n)
        } else {
            (&self.sc.workload.global_prefix, n - keys)
        };
        let op = self.generator.write_of(prefix, rank);
        self.region_fill[region] = (n + 1 < 2 * keys).then_some(n + 1);
        Some(op)
    }

    /// Whether an operation started at `t` is counted and measured (after the
    /// scenario's warm-up).
    fn measured(&self, t: SimTime) -> bool {
        t >= SimTime::ZERO + self.sc.warmup
    }

    fn start_read(
        &mut self,
        client: usize,
        mode: Mode,
        table: Arc<str>,
        key: Bytes,
        consistency: Consistency,
        read_back: Option<Token>,
    ) {
        let _ = table; // the workload's table (`workload_table`)
        if self.measured(self.now) {
            self.metrics.reads += 1;
            self.metrics.modes[mode.index()].count += 1;
            let region = self.clients[client].region;
            self.metrics.regions[region].count += 1;
            self.metrics.region_modes[region][mode.index()].count += 1;
        }
        let op = Op {
            client,
            mode: Some(mode),
            key,
            scope: 0,
            consistency,
            rows: Vec::new(),
            batch: false,
            started: self.now,
            call: Call::Unplanned,
            attempts: Vec::new(),
            wake_at: None,
            answer_queued_until: SimTime::ZERO,
            read_back,
            round: 0,
            replan_at: None,
        };
        let r = self.ops.insert(op);
        self.begin(r);
    }

    fn start_write(&mut self, client: usize, table: Arc<str>, key: Bytes, m: Mutation) {
        if self.measured(self.now) {
            self.metrics.writes.count += 1;
        }
        let mutation = match RowMutation::new(table, key.clone(), vec![m], &Limits::default()) {
            Ok(m) => m,
            Err(_) => {
                if self.measured(self.now) {
                    self.metrics.writes.errors += 1;
                }
                return;
            }
        };
        self.start_rows(client, key, vec![mutation], false);
    }

    /// A batch write (`Client::mutate_rows`): the rows, each one cell write,
    /// sent as the library sends them: rows whose plans start at the same
    /// replica in one request (rows of one key prefix share a scope, so under
    /// nearest routing that is one request; under `writes = "row-affinity"`,
    /// one per affinity replica). Each request is then planned and failed over
    /// as a write, on its first row's plan. A replica that refuses some rows of
    /// a request answers for the others; the refused rows count as failed,
    /// where the library would plan them again.
    fn start_batch(&mut self, client: usize, table: Arc<str>, rows: Vec<BatchRow>) {
        let family: Arc<str> = self.sc.workload.family.as_str().into();
        let consistency = match self.profile.writes {
            WriteRouting::Nearest => Consistency::Eventual,
            WriteRouting::RowAffinity => Consistency::RowAffinity,
        };
        // Requests by the replica their rows' plans start at, in the order of
        // their first rows.
        let mut requests: Vec<(Option<usize>, Vec<RowMutation>)> = Vec::new();
        for row in rows {
            let m = Mutation::SetCell {
                family: family.clone(),
                column: Bytes::from(format!("c{}", row.column)),
                value: row.value,
            };
            let Ok(m) = RowMutation::new(table.clone(), row.key, vec![m], &Limits::default())
            else {
                if self.measured(self.now) {
                    self.metrics.batches.count += 1;
                    self.metrics.batches.errors += 1;
                }
                continue;
            };
            let scope_id = self.clients[client].location.scope_of(
                &self.views[self.client_view],
                &table,
                m.row_key(),
            );
            let scope = self.scopes.get(scope_id.as_str()).unwrap_or(0);
            let to = self
                .plan(client, scope, &scope_id, &table, m.row_key(), &consistency)
                .ok()
                .and_then(|mut order| order.primary.next())
                .and_then(|c| self.names.get(c.replica.as_str()));
            match requests.iter_mut().find(|(r, _)| *r == to) {
                Some((_, rows)) => rows.push(m),
                None => requests.push((to, vec![m])),
            }
        }
        for (_, rows) in requests {
            if self.measured(self.now) {
                self.metrics.batches.count += 1;
            }
            let key = rows[0].row_key().clone();
            self.start_rows(client, key, rows, true);
        }
    }

    fn start_rows(&mut self, client: usize, key: Bytes, rows: Vec<RowMutation>, batch: bool) {
        let op = Op {
            client,
            mode: None,
            key,
            scope: 0,
            consistency: Consistency::Eventual,
            rows,
            batch,
            started: self.now,
            call: Call::Unplanned,
            attempts: Vec::new(),
            wake_at: None,
            answer_queued_until: SimTime::ZERO,
            read_back: None,
            round: 0,
            replan_at: None,
        };
        let r = self.ops.insert(op);
        self.begin(r);
    }

    /// Plans `op` on its client's deployment and location metadata, as the
    /// library plans a call (or plans it again after a refusal), and starts its
    /// call with the time left to its deadline.
    fn begin(&mut self, op_ref: OpRef) {
        let Some(op) = self.ops.get_mut(op_ref) else {
            return;
        };
        let (client, key) = (op.client, op.key.clone());
        let table = self.workload_table.clone();
        let scope_id =
            self.clients[client]
                .location
                .scope_of(&self.views[self.client_view], &table, &key);
        let scope = self.scopes.get(scope_id.as_str()).unwrap_or(0);
        op.scope = scope;
        let is_read = op.mode.is_some();
        // Writes go to the nearest allowed replica, the order of an eventual plan,
        // or, for a profile with `writes = "row-affinity"`, to the row's affinity
        // replica first: the order of an affinity read (`Client::mutate`).
        let consistency = match (is_read, self.profile.writes) {
            (true, _) => op.consistency.clone(),
            (false, WriteRouting::Nearest) => Consistency::Eventual,
            (false, WriteRouting::RowAffinity) => Consistency::RowAffinity,
        };
        let started = op.started;
        let Ok(plan) = self.plan(client, scope, &scope_id, &table, &key, &consistency) else {
            // No replica may take the row: as a replica's refusal.
            self.refused(op_ref);
            return;
        };
        let budget = if is_read {
            self.sc.workload.deadline
        } else {
            self.sc.workload.write_deadline
        };
        let left = SimDuration::from_us(
            budget
                .as_us()
                .saturating_sub(self.now.saturating_since(started).as_us()),
        );
        let (now, left) = (self.now.as_us(), Duration::from_micros(left.as_us()));
        let call = if is_read {
            // As the library (`read::run`): the hedge after the hedger's delay, or
            // for a read that may not be hedged, failover once its first replica
            // has been silent for several round trips.
            let policy = self.sc.workload.hedge.then(HedgePolicy::default);
            let deadline = Duration::from_micros(budget.as_us());
            let (names, c) = (&self.names, &mut self.clients[client]);
            let hedge_after = |first: Option<&Candidate>| {
                let rtt = first
                    .and_then(|f| names.get(f.replica.as_str()))
                    .and_then(|r| c.rtt_ms_of(r));
                call::hedge_delay(&mut c.hedger, policy.as_ref(), &consistency, deadline, rtt)
            };
            let record = self.record_reads_left > 0;
            if record {
                self.record_reads_left -= 1;
            }
            let new = if record {
                ReadCall::recorded
            } else {
                ReadCall::new
            };
            Call::Read(new(
                plan.primary,
                plan.fallback,
                &consistency,
                now,
                left,
                hedge_after,
            ))
        } else {
            Call::Write(WriteCall::new(plan.primary, now, left, Resend::default()))
        };
        let Some(op) = self.ops.get_mut(op_ref) else {
            return;
        };
        op.call = call;
        op.attempts.clear();
        self.drive(op_ref);
    }

    /// Replicas refused `op`'s row, or no replica may take it: as the library,
    /// refresh location metadata and plan again (`frontend::policy_refresh_wait`:
    /// at once, then after 10, 20, 40 … 320 ms, within the deadline), else fail it.
    fn refused(&mut self, op_ref: OpRef) {
        let Some(op) = self.ops.get_mut(op_ref) else {
            return;
        };
        let budget = if op.mode.is_some() {
            self.sc.workload.deadline
        } else {
            self.sc.workload.write_deadline
        };
        let elapsed = self.now.saturating_since(op.started);
        let wait = frontend::policy_refresh_wait(op.round)
            .map(|w| SimDuration::from_us(w.as_micros() as u64))
            .filter(|w| elapsed + *w < budget);
        let Some(wait) = wait else {
            let op = self.ops.remove(op_ref).expect("live op");
            match op.mode {
                Some(mode) => {
                    self.finish_read(op.client, mode, op.started, Err(ErrKind::Policy), None)
                }
                None => {
                    if self.measured(op.started) {
                        match op.batch {
                            false => self.metrics.writes.errors += 1,
                            true => self.metrics.batches.errors += 1,
                        }
                    }
                    self.trace([20, op.client as u64, 0, 0]);
                }
            }
            return;
        };
        op.round += 1;
        op.call = Call::Unplanned;
        self.metrics.counters.policy_refreshes += 1;
        if wait == SimDuration::ZERO {
            let client = op.client;
            self.refresh_location(client);
            self.begin(op_ref);
            return;
        }
        let at = self.now + wait;
        op.replan_at = Some(at);
        op.wake_at = Some(at);
        self.queue.push(at, Ev::Wake { op: op_ref });
    }

    /// Brings `client`'s location metadata up to its source replica's (the
    /// library's refresh, every [`frontend::WATERMARK_REFRESH`] and after a
    /// refusal). Modelled as instant: in a deployment it is one round trip to a
    /// replica of the client's region. A source that is down (or run by another
    /// shard) leaves it as it is.
    pub(super) fn refresh_location(&mut self, client: usize) {
        let c = &mut self.clients[client];
        let Some(rep) = c
            .location_source
            .and_then(|r| self.nodes[r].replica.as_ref())
        else {
            return;
        };
        if rep.location().version() != c.location.version()
            || rep.location().epoch() != c.location.epoch()
        {
            c.location.follow(rep.location());
        }
    }

    /// Does what `op`'s call asks — sends its attempts, ends it, or queues its
    /// wake-up — as `pangea-client`'s drivers do.
    fn drive(&mut self, op_ref: OpRef) {
        let b = self.bucket();
        loop {
            let Some(op) = self.ops.get_mut(op_ref) else {
                return;
            };
            match op.call.poll_action() {
                Some(Action::FallbackRace) => self.metrics.counters.fallback_races += 1,
                Some(Action::Send(n)) => {
                    let Some(a) = op.call.attempt(n) else {
                        return;
                    };
                    let bucket = &mut self.metrics.series[self.clients[op.client].region][b];
                    match a.kind {
                        AttemptKind::Failover => {
                            self.metrics.counters.failovers += 1;
                            bucket.failovers += 1;
                        }
                        AttemptKind::Hedge => {
                            self.metrics.counters.hedges += 1;
                            bucket.hedges += 1;
                        }
                        _ => {}
                    }
                    let c = a.candidate.clone();
                    self.launch(op_ref, n, c);
                }
                None => break,
            }
        }
        self.learn(op_ref);
        let Some(op) = self.ops.get_mut(op_ref) else {
            return;
        };
        if let Some(outcome) = op.call.outcome() {
            let op = self.ops.remove(op_ref).expect("live op");
            self.end(op, outcome);
            return;
        }
        let client = &self.clients[op.client];
        if let Some(t) = op
            .call
            .poll_timeout()
            .map(|t| SimTime::from_us(client.timer_fires(t)))
            && op.wake_at.is_none_or(|w| t < w)
        {
            op.wake_at = Some(t);
            self.queue.push(t, Ev::Wake { op: op_ref });
        }
    }

    /// Applies what `op`'s frontend learned from its call's last step
    /// ([`call::Lesson`], the library's rules, applied as `pangea-client` applies
    /// them): raised estimates, silence ([`Client::no_answer`]), and requests
    /// followed after the call ended until their deadline ([`Self::on_silence`]).
    ///
    /// [`Client::no_answer`]: super::client::Client::no_answer
    fn learn(&mut self, op_ref: OpRef) {
        let now = self.now;
        let Some(op) = self.ops.get_mut(op_ref) else {
            return;
        };
        let client = op.client;
        let lessons: Vec<_> = op
            .call
            .lessons()
            .into_iter()
            .filter_map(|lesson| {
                let n = lesson.attempt();
                let since = op.call.attempt(n)?.since_us;
                Some((lesson, n, op.attempts.get(n)?.replica, since))
            })
            .collect();
        for (lesson, n, r, since) in lessons {
            match lesson {
                call::Lesson::Slower { out_us, .. } => {
                    self.clients[client].note_slower(r, SimDuration::from_us(out_us))
                }
                call::Lesson::NoAnswer { waited_us, .. } => {
                    self.clients[client].no_answer(r, SimDuration::from_us(waited_us), now)
                }
                call::Lesson::Follow { until_us, .. } => {
                    let until = SimTime::from_us(until_us);
                    self.detached.insert(
                        (op_ref, n as u16),
                        Detached {
                            client: client as u32,
                            r: r as u32,
                            since: SimTime::from_us(since),
                            until,
                        },
                    );
                    self.queue.push(
                        until.max(now),
                        Ev::Silence {
                            op: op_ref,
                            attempt: n as u16,
                        },
                    );
                }
            }
        }
    }

    /// A request followed after its call ended ([`Self::learn`]) got no
    /// answer by the call's deadline.
    pub(super) fn on_silence(&mut self, op: OpRef, attempt: u16) {
        if let Some(d) = self.detached.remove(&(op, attempt)) {
            let waited = d.until.saturating_since(d.since);
            self.clients[d.client as usize].no_answer(d.r as usize, waited, self.now);
        }
    }

    /// `op`'s call ended with `outcome` (a write's acknowledgement is handled where
    /// it arrives, `on_response`).
    fn end(&mut self, op: Op, outcome: Outcome) {
        if let Call::Read(c) = &op.call
            && let Some(log) = c.log()
        {
            self.recorded_reads.push(log.clone());
        }
        let err_of = |n: usize| {
            op.attempts
                .get(n)
                .and_then(|a| a.err)
                .unwrap_or(ErrKind::Deadline)
        };
        let refused = match outcome {
            Outcome::Failed { attempt } | Outcome::LastError { attempt } => {
                err_of(attempt) == ErrKind::Policy
            }
            _ => false,
        };
        if refused {
            let r = self.ops.insert(op);
            self.refused(r);
            return;
        }
        let result = match outcome {
            Outcome::Served { attempt, reason } => Ok((
                op.attempts.get(attempt).map_or(usize::MAX, |a| a.replica),
                reason,
            )),
            Outcome::Failed { attempt }
            | Outcome::LastError { attempt }
            | Outcome::Ambiguous { attempt } => Err(err_of(attempt)),
            Outcome::NotCovered { .. } => Err(ErrKind::NotCovered),
            Outcome::DeadlineExceeded => Err(ErrKind::Deadline),
            Outcome::NoCandidate => Err(ErrKind::Unavailable),
        };
        match (op.mode, result) {
            (Some(mode), Ok(served)) => {
                self.finish_read(op.client, mode, op.started, Ok(()), Some(served))
            }
            (Some(mode), Err(e)) => self.finish_read(op.client, mode, op.started, Err(e), None),
            (None, _) => self.fail_write(op.client, op.started, op.batch),
        }
    }

    /// Plans a request of `client` as `pangea-client` does (`order_read_routed`, the
    /// order `plan_read_routed` builds its plan from, on the newest deployment and
    /// the region's route table; the operation's scope, worked out when it started,
    /// is passed in rather than worked out again); writes plan as eventual reads
    /// (nearest allowed replica first).
    fn plan(
        &mut self,
        client: usize,
        scope: usize,
        scope_id: &ScopeId,
        table: &Arc<str>,
        key: &Bytes,
        consistency: &Consistency,
    ) -> Result<ReadOrder, RouteError> {
        let now_wall_ms = self.now_wall_ms();
        let c = &mut self.clients[client];
        c.expire_down_marks(self.now);
        let mut orders = std::mem::take(&mut c.orders);
        let location = std::mem::take(&mut c.location);
        let c = &self.clients[client];
        let view = View {
            client: c,
            replicas: &self.names,
            ranked: &self.rank_replica[self.client_view],
            scope,
            now: self.now,
            now_ms: now_wall_ms,
        };
        let req = ReadRequest {
            client_region: &c.region_id,
            profile: &self.profile,
            table,
            key,
            consistency,
            deadline: Some(Duration::from_micros(self.sc.workload.deadline.as_us())),
        };
        let order = order_read_cached(
            &self.views[self.client_view],
            &self.routes[self.client_view][c.region],
            &mut orders,
            scope_id.clone(),
            &location,
            &req,
            &view,
            now_wall_ms,
        );
        self.clients[client].orders = orders;
        self.clients[client].location = location;
        order
    }

    /// The clients' wall clock (true time; frontends are not skewed).
    pub(super) fn now_wall_ms(&self) -> u64 {
        wall_ms_at(self.now)
    }

    /// Sends attempt `attempt` of `op` to candidate `c`.
    fn launch(&mut self, r: OpRef, attempt: usize, c: Candidate) {
        let replica = self.names.get(c.replica.as_str());
        let now = self.now;
        let Some(op) = self.ops.get_mut(r) else {
            return;
        };
        debug_assert_eq!(attempt, op.attempts.len(), "attempts are sent in order");
        op.attempts.push(Attempt {
            replica: replica.unwrap_or(usize::MAX),
            err: None,
        });
        // A replica the simulation does not know is never reached.
        let Some(replica) = replica else {
            return;
        };
        let client = op.client;
        let write = (!op.rows.is_empty()).then(|| op.rows.clone().into_boxed_slice());
        let bytes = match op.rows.as_slice() {
            [] => ENVELOPE_BYTES + op.key.len(),
            rows => {
                ENVELOPE_BYTES
                    + rows
                        .iter()
                        .map(|m| m.row_key().len() + m.payload_bytes())
                        .sum::<usize>()
            }
        };
        let region = self.clients[client].region;
        self.count_client_bytes(region, replica, bytes);
        // The frontend's CPU first, when it shares the replicas' machine.
        let now = self.frontend_cpu(now);
        if let Some(delay) = self.client_path(region, replica, true) {
            let to = self.shard_of_replica(replica);
            let remote = (!self.replica_here(replica) && write.is_none())
                .then(|| self.ops.get_mut(r))
                .flatten()
                .map(|op| {
                    Box::new(RemoteRead {
                        key: op.key.clone(),
                        consistency: op.consistency.clone(),
                    })
                });
            self.push_to(
                to,
                now + delay,
                Ev::Request {
                    op: r,
                    // Attempts per op are few (a plan has tens of candidates at most).
                    attempt: attempt as u16,
                    r: replica as u32,
                    client: client as u32,
                    write,
                    remote,
                },
            );
        }
    }

    /// Sends a refusal from replica `r`'s host back to `client` now (its operating
    /// system's: no core, no overhead).
    pub(super) fn reply(
        &mut self,
        op: OpRef,
        attempt: u16,
        r: usize,
        client: usize,
        reply: Reply,
        bytes: usize,
    ) {
        self.answer_at(self.now, op, attempt, r, client, reply, bytes);
    }

    /// Sends replica `r`'s answer to `client`, which leaves its cores (or its
    /// disk, for a write's acknowledgement) at `at`: it pays the host's overhead
    /// (`HostModel::overhead_us`, unless refused) and the path back.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn answer_at(
        &mut self,
        at: SimTime,
        op: OpRef,
        attempt: u16,
        r: usize,
        client: usize,
        reply: Reply,
        bytes: usize,
    ) {
        let region = self.clients[client].region;
        self.count_client_bytes(region, r, bytes);
        if let Some(delay) = self.client_path(region, r, false) {
            let overhead = match reply {
                Reply::Refused => SimDuration::ZERO,
                _ => self.nodes[r].host.overhead(),
            };
            let at = at.max(self.now) + overhead + delay;
            let to = self.shard_of_region(region);
            self.push_to(
                to,
                at,
                Ev::Response {
                    op,
                    attempt,
                    r: r as u32,
                    reply: Box::new(reply),
                    received: false,
                },
            );
        }
    }

    // ---- at the replica ---------------------------------------------------------

    pub(super) fn on_request(
        &mut self,
        op: OpRef,
        attempt: u16,
        r: usize,
        client: usize,
        write: Option<Box<[RowMutation]>>,
        remote: Option<Box<RemoteRead>>,
    ) {
        let region = self.clients[client].region;
        if self
            .net
            .path_state(region, self.nodes[r].region)
            .is_some_and(|p| p.cut)
        {
            return; // dropped in flight by a partition
        }
        if self.nodes[r].replica.is_none() {
            if self.nodes[r].silent == 0 {
                // The process is gone, its host answers: connection refused.
                self.reply(op, attempt, r, client, Reply::Refused, ENVELOPE_BYTES);
            }
            return; // a lost host: silence
        }
        if self.nodes[r].paused > 0 {
            self.nodes[r].held_requests.push(Ev::Request {
                op,
                attempt,
                r: r as u32,
                client: client as u32,
                write,
                remote,
            });
            return;
        }
        match write {
            Some(rows) => self.serve_write(op, attempt, r, client, rows),
            None => self.serve_read(op, attempt, r, client, remote),
        }
    }

    fn serve_read(
        &mut self,
        op_ref: OpRef,
        attempt: u16,
        r: usize,
        client: usize,
        remote: Option<Box<RemoteRead>>,
    ) {
        if self.nodes[r].gate.is_some() {
            // Still catching up after its restart (the readiness gate): the client
            // asks the next candidate.
            let refused = Reply::Err(ErrKind::Unavailable, None);
            let cost = self.nodes[r].host.model().read;
            let done = self.nodes[r].host.run(self.now, Work::Read, cost, 1, 0);
            self.answer_at(done, op_ref, attempt, r, client, refused, ENVELOPE_BYTES);
            return;
        }
        let (reply, bytes) = {
            let (key, consistency) = match remote.as_deref() {
                Some(x) => (&x.key, &x.consistency),
                None => {
                    let Some(op) = self.ops.get(op_ref) else {
                        return; // the client gave up; a read has no effect
                    };
                    (&op.key, &op.consistency)
                }
            };
            let node = &self.nodes[r];
            let nw = node.now(self.now);
            let Some(rep) = node.replica.as_ref() else {
                return;
            };
            // As the node: the row's scope as this replica's location metadata has
            // it, whatever the client planned with (the client's may be stale).
            let row_scope = rep.scope_of(&self.workload_table, key);
            let scope_id = &row_scope;
            // The node's admission rule: a token is checked against its own
            // scope's stream where this replica holds it.
            let vouching = vouching_scope(scope_id, consistency, |s| rep.tree(s).is_some());
            match rep.tree(scope_id).and_then(|_| rep.watermarks(vouching)) {
                // Not a member of the row's scope (a stale plan after a placement change).
                None => (Reply::Err(ErrKind::Policy, None), ENVELOPE_BYTES),
                Some(wm) => match decide(consistency, &wm, nw.wall_ms) {
                    Decision::Serve => {
                        let table = self.sc.workload.table.as_str();
                        // `get_row` without the copy: only the size of the answer (the
                        // newest version of every cell) is needed.
                        let schema = self.workload_schema[node.view].as_ref();
                        let bytes = rep
                            .storage()
                            .row_at(table, key)
                            .map_or(0, |row| row.latest_value_bytes(schema, nw.wall_ms));
                        // C4: a watermark read is served only by a replica that applied
                        // the token's write.
                        if let Consistency::Watermark(token) = consistency
                            && let (Some(s), Some(o)) = (
                                self.scopes.get(token.scope.as_str()),
                                self.names.get(token.origin.as_str()),
                            )
                        {
                            let applied = self.checks.applied[self.checks.idx(r, s, o)];
                            if applied < token.sequence {
                                self.checks.token_violations += 1;
                                self.checks.violation(format!(
                                    "C4: {} served a read of {}/{} #{} having applied only #{applied}",
                                    node.id, token.scope, token.origin, token.sequence
                                ));
                            }
                        }
                        // C7: an origin whose watermark here is older than the
                        // bound counted as fresh by vouching. No replica this one
                        // has heard since the bound before (less the clocks'
                        // allowed offset) may have applied, when its clock read
                        // that time, a write of that origin this one lacks.
                        // A read as of a time makes the promise of a bounded
                        // read of `now - ms` at the replica's clock.
                        if let Some(max_ms) = &consistency.staleness_bound_ms(nw.wall_ms)
                            && let Some(s) = self.scopes.get(scope_id.as_str())
                        {
                            let claim_ms = nw.wall_ms as i64
                                - (*max_ms + rep.config().max_offset_ms) as i64
                                - BASE_WALL_MS as i64;
                            let mut heard: Option<Vec<(usize, u64)>> = None;
                            for (origin, w) in wm.iter() {
                                if staleness_ms(w.timestamp, nw.wall_ms) <= *max_ms {
                                    continue;
                                }
                                let Some(o) = self.names.get(origin.as_str()) else {
                                    continue;
                                };
                                // Each replica heard since the claim (on this
                                // replica's clock), and when its clock read the claim.
                                let heard = heard.get_or_insert_with(|| {
                                    let claim = nw.wall_ms as i64
                                        - (*max_ms + rep.config().max_offset_ms) as i64;
                                    rep.heard_reporters(scope_id, nw)
                                        .iter()
                                        .filter(|(_, since)| since.wall_ms() as i64 <= claim)
                                        .filter_map(|(p, _)| self.names.get(p.as_str()))
                                        .map(|p| {
                                            let ms = claim_ms - self.nodes[p].skew_ms;
                                            // Never after the read (a reader's clock
                                            // ahead puts its claim in the future).
                                            let us =
                                                (ms.max(0) as u64 * 1_000).min(self.now.as_us());
                                            (p, us)
                                        })
                                        .collect()
                                });
                                if let Some((p, had)) =
                                    self.checks.lacked(r, s, o, w.sequence, heard)
                                {
                                    self.checks.staleness_violations += 1;
                                    self.checks.violation(format!(
                                        "C7: {} served a {max_ms} ms bounded (or as-of) read holding \
                                         {scope_id}/{origin} #{} while {}, which it has heard \
                                         since, had #{had} the bound (and max offset) before",
                                        node.id, w.sequence, self.nodes[p].id
                                    ));
                                }
                            }
                        }
                        let reply = Reply::Ok {
                            wm: Some(wm),
                            token: None,
                            failed_rows: 0,
                        };
                        (reply, ENVELOPE_BYTES + key.len() + bytes)
                    }
                    Decision::NotCovered { .. } => (
                        Reply::Err(ErrKind::NotCovered, Some(wm)),
                        ENVELOPE_BYTES + key.len(),
                    ),
                    Decision::TooStale { .. } => (
                        Reply::Err(ErrKind::TooStale, Some(wm)),
                        ENVELOPE_BYTES + key.len(),
                    ),
                },
            }
        };
        // Decided as it arrives, answered once a core has served it.
        let cost = self.nodes[r].host.model().read;
        let done = self.nodes[r].host.run(self.now, Work::Read, cost, 1, bytes);
        self.answer_at(done, op_ref, attempt, r, client, reply, bytes);
    }

    /// A write of one row or a batch's rows (`mutate_rows`): every row checked
    /// alone and proposed as it arrives, in order; the turn goes to the disk once
    /// a core has served the request, and the write is answered when its rows'
    /// commits end (`settle`, `row_done`). A request whose every row is refused
    /// is refused (the client plans again after a location refresh).
    fn serve_write(
        &mut self,
        op: OpRef,
        attempt: u16,
        r: usize,
        client: usize,
        rows: Box<[RowMutation]>,
    ) {
        let cost = self.nodes[r].host.model().write;
        let bytes = rows.iter().map(RowMutation::payload_bytes).sum();
        let done = self.nodes[r]
            .host
            .run_driver(self.now, Work::Write, cost, rows.len(), bytes);
        let n = rows.len() as u32;
        let (mut proposed, mut first) = (0, None);
        for (i, m) in rows.into_vec().into_iter().enumerate() {
            // Waiting for more regions than the row's policy spans: refused unwritten.
            if self.sc.workload.write_ack != WriteAck::Origin
                && let Some(rep) = self.nodes[r].replica.as_ref()
            {
                let scope = rep.scope_of(m.table(), m.row_key());
                if self.regions_to_wait_for(r, &scope).is_none() {
                    continue;
                }
            }
            let node = &mut self.nodes[r];
            let nw = node.now(self.now);
            let Some(rep) = node.replica.as_mut() else {
                return;
            };
            let Ok(token) = rep.propose(nw, m.clone()) else {
                continue;
            };
            let (Some(s), Some(o)) = (
                self.scopes.get(token.scope.as_str()),
                self.names.get(token.origin.as_str()),
            ) else {
                continue;
            };
            let st = self.checks.stream(s, o);
            let v = &mut self.checks.proposed_us[st];
            let seq = (token.sequence - 1) as usize;
            if v.len() <= seq {
                v.resize(seq + 1, u64::MAX);
            }
            v[seq] = self.now.as_us();
            self.pending_commits.insert(
                (r as u32, s as u32, token.sequence),
                (op, attempt, client as u32, m),
            );
            proposed += 1;
            if i == 0 {
                first = Some((s as u32, token.sequence));
            }
        }
        if proposed == 0 {
            let refused = Reply::Err(ErrKind::Policy, None);
            self.answer_at(done, op, attempt, r, client, refused, ENVELOPE_BYTES);
            return;
        }
        if n > 1 {
            let wait = BatchWait {
                left: proposed,
                failed: n - proposed,
                first,
                token: None,
            };
            self.batch_waits.insert((op, attempt, r as u32), wait);
        }
        // Acknowledged from the `Committed` events of this flush.
        self.nodes[r].turn = Some(done);
        self.settle(r);
    }

    // ---- back at the client ---------------------------------------------------------

    /// When a frontend that takes up CPU at `at` is done with it: at once, unless
    /// the frontends share the replicas' machine (`Simulation::frontends`).
    fn frontend_cpu(&mut self, at: SimTime) -> SimTime {
        match &mut self.frontends {
            Some(f) => {
                let cost = f.model().read;
                f.run(at, Work::Frontend, cost, 1, 0)
            }
            None => at,
        }
    }

    /// An answer reached its frontend (`received`: and the frontend has spent its
    /// CPU on it, when that is modelled — the answer is then judged dropped by a
    /// partition or not once that is done, a moment after it arrived).
    pub(super) fn on_response(
        &mut self,
        op_ref: OpRef,
        attempt: usize,
        r: usize,
        reply: Box<Reply>,
        received: bool,
    ) {
        if !received && self.frontends.is_some() {
            let at = self.frontend_cpu(self.now);
            if let Some(op) = self.ops.get_mut(op_ref) {
                op.answer_queued_until = op.answer_queued_until.max(at);
            }
            self.queue.push(
                at,
                Ev::Response {
                    op: op_ref,
                    attempt: attempt as u16,
                    r: r as u32,
                    reply,
                    received: true,
                },
            );
            return;
        }
        let reply = *reply;
        if self.ops.get(op_ref).is_none() {
            // The call is over; a request it left out still teaches its round trip.
            if let Some(d) = self.detached.remove(&(op_ref, attempt as u16)) {
                let client = d.client as usize;
                let region = self.clients[client].region;
                if self
                    .net
                    .path_state(self.nodes[r].region, region)
                    .is_some_and(|p| p.cut)
                {
                    // Dropped in flight: silence after all.
                    self.detached.insert((op_ref, attempt as u16), d);
                    return;
                }
                let now = self.now;
                match reply {
                    Reply::Refused => self.clients[client].mark_down(r, now),
                    _ => self.clients[client].note_rtt(r, now.saturating_since(d.since)),
                }
            }
            return;
        }
        if let Some(op) = self.ops.get_mut(op_ref) {
            let region = self.clients[op.client].region;
            if self
                .net
                .path_state(self.nodes[r].region, region)
                .is_some_and(|p| p.cut)
            {
                return; // dropped in flight by a partition
            }
        }
        let now = self.now;
        let Some(op) = self.ops.get_mut(op_ref) else {
            return;
        };
        let Some(att) = op.call.attempt(attempt) else {
            return;
        };
        if att.done {
            return;
        }
        let elapsed = now.saturating_since(SimTime::from_us(att.since_us));
        let scope = op.scope;
        let now_ms = wall_ms_at(now);
        // A write that waited for other regions took the WAN's time, not the
        // path's: routing and hedging must not learn from it (`Inner::ask`).
        let learns = op.mode.is_some() || self.sc.workload.write_ack == WriteAck::Origin;
        let client = &mut self.clients[op.client];
        let result: std::result::Result<(Option<Token>, u32), ErrKind> = match reply {
            Reply::Refused => {
                client.mark_down(r, now);
                Err(ErrKind::Unavailable)
            }
            Reply::Ok {
                wm,
                token,
                failed_rows,
            } => {
                if learns {
                    client.note_rtt(r, elapsed);
                    client
                        .hedger
                        .record(now.as_us(), Duration::from_micros(elapsed.as_us()));
                }
                if let (Some(t), Some(w)) = (&op.read_back, &wm)
                    && !w.covers(t)
                {
                    self.metrics.counters.read_backs_stale += 1;
                    if self.nodes[r].id != t.origin {
                        self.metrics.counters.read_backs_stale_elsewhere += 1;
                    }
                }
                if let Some(w) = wm {
                    client.learn(r, scope, w, now_ms);
                }
                Ok((token, failed_rows))
            }
            Reply::Err(kind, wm) => {
                if learns {
                    client.note_rtt(r, elapsed);
                }
                if let Some(w) = wm {
                    client.learn(r, scope, w, now_ms);
                }
                Err(kind)
            }
        };
        let reply = match &result {
            Ok(_) => CallReply::Served,
            Err(e) => e.reply(),
        };
        if let (Err(e), Some(a)) = (&result, op.attempts.get_mut(attempt)) {
            a.err = Some(*e);
        }
        op.call.handle_reply(now, attempt, reply);
        if let (Ok((token, failed_rows)), None, Some(Outcome::Served { .. })) =
            (result, op.mode, op.call.outcome())
        {
            self.learn(op_ref);
            let op = self.ops.remove(op_ref).expect("live op");
            self.write_acknowledged(op, r, token, failed_rows);
            return;
        }
        self.drive(op_ref);
    }

    /// `op` was answered by replica `r`: a write with its token, a batch with its
    /// first row's (if that row was taken) and how many of its rows were refused.
    fn write_acknowledged(&mut self, op: Op, r: usize, token: Option<Token>, failed_rows: u32) {
        let latency = self.now.saturating_since(op.started);
        if op.batch {
            let rows = op.rows.len() as u64;
            if self.measured(op.started) {
                metrics::record(&mut self.metrics.batches.ok, latency.as_us());
                let c = &mut self.metrics.counters;
                c.batch_rows_acknowledged += rows - u64::from(failed_rows);
                c.batch_rows_refused += u64::from(failed_rows);
            }
            self.trace([23, op.client as u64, r as u64, latency.as_us()]);
            // Read-your-writes of the batch's first row.
            if let Some(t) = token {
                self.clients[op.client].last_write = Some((op.key, t));
            }
            return;
        }
        if let (Some(m), Some(t)) = (op.rows.first(), &token) {
            self.metrics.counters.increments_acknowledged += self
                .checks
                .count_acknowledged(m, Version::new(t.timestamp, t.origin.clone()));
        }
        if self.measured(op.started) {
            metrics::record(&mut self.metrics.writes.ok, latency.as_us());
        }
        self.trace([21, op.client as u64, r as u64, latency.as_us()]);
        if let Some(t) = token {
            let read_back = self.sc.workload.read_back;
            if read_back > 0.0 && self.generator.chance(read_back) {
                self.metrics.counters.read_backs += 1;
                let table = self.workload_table.clone();
                self.start_read(
                    op.client,
                    Mode::Affinity,
                    table,
                    op.key.clone(),
                    Consistency::RowAffinity,
                    Some(t.clone()),
                );
            }
            self.clients[op.client].last_write = Some((op.key, t));
        }
    }

    fn fail_write(&mut self, client: usize, started: SimTime, batch: bool) {
        if self.measured(started) {
            match batch {
                false => self.metrics.writes.errors += 1,
                true => self.metrics.batches.errors += 1,
            }
            let (region, b) = (self.clients[client].region, self.bucket());
            self.metrics.series[region][b].write_errors += 1;
        }
        self.trace([22, client as u64, 0, 0]);
    }

    /// An operation's call asked to be woken about now.
    pub(super) fn on_wake(&mut self, op_ref: OpRef) {
        let now = self.now;
        let Some(op) = self.ops.get_mut(op_ref) else {
            return;
        };
        if op.wake_at == Some(now) {
            op.wake_at = None;
        }
        if op.replan_at == Some(now) {
            op.replan_at = None;
            let client = op.client;
            self.refresh_location(client);
            self.begin(op_ref);
            return;
        }
        // An answer that reached the frontend before its timer is taken first:
        // the thread that would fire the timer is busy until the answer is
        // handled, and the library's loop takes answers before timers.
        if op.answer_queued_until > now {
            let at = op.answer_queued_until;
            if op.wake_at.is_none_or(|w| at < w) {
                op.wake_at = Some(at);
                self.queue.push(at, Ev::Wake { op: op_ref });
            }
            return;
        }
        match &mut op.call {
            Call::Read(c) => c.handle_timeout(now.as_us(), &mut self.clients[op.client].hedger),
            Call::Write(c) => c.handle_timeout(now.as_us()),
            Call::Unplanned => {}
        }
        self.drive(op_ref);
    }

    fn finish_read(
        &mut self,
        client: usize,
        mode: Mode,
        started: SimTime,
        result: std::result::Result<(), ErrKind>,
        served: Option<(usize, Reason)>,
    ) {
        if !self.measured(started) {
            return; // neither counted nor measured
        }
        let region = self.clients[client].region;
        let latency = self.now.saturating_since(started);
        let b = self.bucket();
        match result {
            Ok(()) => {
                self.metrics.reads_ok += 1;
                let us = latency.as_us();
                metrics::record(&mut self.metrics.modes[mode.index()].ok, us);
                metrics::record(&mut self.metrics.regions[region].ok, us);
                metrics::record(&mut self.metrics.region_modes[region][mode.index()].ok, us);
                self.metrics.series[region][b].reads.record(us);
                let (r, reason) = served.unwrap_or((usize::MAX, Reason::Nearest));
                self.trace([30 + mode.index() as u64, client as u64, r as u64, us]);
                let _ = reason;
            }
            Err(e) => {
                self.metrics.modes[mode.index()].errors += 1;
                self.metrics.regions[region].errors += 1;
                self.metrics.region_modes[region][mode.index()].errors += 1;
                self.metrics.series[region][b].read_errors += 1;
                *self
                    .metrics
                    .counters
                    .read_errors
                    .entry(e.as_str().to_owned())
                    .or_default() += 1;
                self.trace([40 + mode.index() as u64, client as u64, e as u64, 0]);
            }
        }
    }

    // ---- background probes (the library's watermark refresh) --------------------

    /// One round of probes, as the library's refresh task runs them: every usable
    /// replica at once; the next round [`PROBE_INTERVAL`] after the last probe of
    /// this one answered or timed out ([`Self::probe_done`]).
    pub(super) fn on_probe(&mut self, client: usize) {
        if !self.workload_on {
            return;
        }
        let region = self.clients[client].region;
        if self.region_lost[region] > 0 {
            self.next_probe_round(client);
            return;
        }
        // The library's refresh task reads location metadata with each round.
        self.refresh_location(client);
        let d = self.views[self.client_view].clone();
        let mut usable: Vec<usize> =
            pangea_core::read::usable(&d, &self.profile, &self.clients[client].region_id)
                .into_iter()
                .filter_map(|r| self.names.get(r.as_str()))
                .collect();
        usable.sort_unstable();
        if usable.is_empty() {
            self.next_probe_round(client);
            return;
        }
        self.clients[client].probes_pending = usable.len();
        for r in usable {
            let now = self.now;
            self.clients[client].probe_sent[r] = Some(now);
            self.queue.push(
                now + PROBE_TIMEOUT,
                Ev::ProbeTimeout {
                    client: client as u32,
                    r: r as u32,
                    sent_at: now,
                },
            );
            if let Some(delay) = self.client_path(region, r, true) {
                let to = self.shard_of_replica(r);
                self.push_to(
                    to,
                    now + delay,
                    Ev::ProbeRequest {
                        client: client as u32,
                        r: r as u32,
                        sent_at: now,
                    },
                );
            }
        }
    }

    pub(super) fn on_probe_request(&mut self, client: usize, r: usize, sent_at: SimTime) {
        let region = self.clients[client].region;
        if self
            .net
            .path_state(region, self.nodes[r].region)
            .is_some_and(|p| p.cut)
        {
            return;
        }
        if self.nodes[r].paused > 0 || (self.nodes[r].replica.is_none() && self.nodes[r].silent > 0)
        {
            // Paused: answered after the probe timed out, nothing to learn. A lost
            // host: never answered.
            return;
        }
        let wms = self.nodes[r].replica.as_ref().map(|rep| {
            rep.scopes()
                .filter_map(|s| {
                    let i = self.scopes.get(s.as_str())?;
                    Some((i, rep.watermarks(s)?))
                })
                .collect::<Vec<_>>()
        });
        if let Some(delay) = self.client_path(region, r, false) {
            let at = if wms.is_some() {
                let cost = self.nodes[r].host.model().read;
                let done = self.nodes[r]
                    .host
                    .run(self.now, Work::Watermarks, cost, 1, 0);
                done + self.nodes[r].host.overhead() + delay
            } else {
                self.now + delay // refused by the host's operating system
            };
            let to = self.shard_of_region(region);
            self.push_to(
                to,
                at,
                Ev::ProbeReply {
                    client: client as u32,
                    r: r as u32,
                    sent_at,
                    wms,
                },
            );
        }
    }

    pub(super) fn on_probe_reply(
        &mut self,
        client: usize,
        r: usize,
        sent_at: SimTime,
        wms: Option<Vec<(usize, ScopeWatermarks)>>,
    ) {
        let now = self.now;
        let now_ms = self.now_wall_ms();
        let c = &mut self.clients[client];
        if c.probe_sent[r] != Some(sent_at) {
            return; // timed out already
        }
        c.probe_sent[r] = None;
        match wms {
            Some(wms) => {
                c.note_rtt(r, now.saturating_since(sent_at));
                for (s, w) in wms {
                    c.learn(r, s, w, now_ms);
                }
                c.mark_up(r);
            }
            None => c.mark_unreachable(r, now),
        }
        self.probe_done(client);
    }

    pub(super) fn on_probe_timeout(&mut self, client: usize, r: usize, sent_at: SimTime) {
        let c = &mut self.clients[client];
        if c.probe_sent[r] == Some(sent_at) {
            c.probe_sent[r] = None;
            c.mark_unreachable(r, self.now);
            self.probe_done(client);
        }
    }

    /// One probe of the current round answered or timed out.
    fn probe_done(&mut self, client: usize) {
        let c = &mut self.clients[client];
        c.probes_pending = c.probes_pending.saturating_sub(1);
        if c.probes_pending == 0 {
            self.next_probe_round(client);
        }
    }

    fn next_probe_round(&mut self, client: usize) {
        self.queue.push(
            self.now + PROBE_INTERVAL,
            Ev::Probe {
                client: client as u32,
            },
        );
    }
}
