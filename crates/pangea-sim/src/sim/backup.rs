//! Backups in the simulator: the `backup` fault runs what `pangea backup create`
//! does (`pangea_ops::backup::create`) from a region, against the simulated
//! replicas and over the simulated WAN, while the workload and the other faults
//! go on. Each scope is read from the nearest replica that may serve it
//! (`Deployment::scope_sources`, the tool's own choice):
//!
//! 1. its durable watermarks, `start`;
//! 2. every row of every table, page by page (1,000 rows a call), all versions;
//! 3. its watermarks again until they cover every version the rows showed: `end`,
//!    the cut;
//! 4. each table's change stream from `start` to `end` (`pangea_core::changes`,
//!    as the node serves it): the tail.
//!
//! Each step is one call: the request crosses the path from the tool's region
//! to the replica (partitions, jitter and loss included), the replica's host
//! serves it (snapshot work on its cores), and the answer crosses back. A call
//! refused (the process is gone, or catching up after a restart) or unanswered
//! by its deadline (a lost host, a partition) hands the scope to the next
//! replica, from the start, as the tool does.
//!
//! Checker C10 runs as a scope finishes: the rows with the tail merged into them
//! must be, row by row, exactly the oracle's rows as of the cut — every durable
//! write of the scope's streams at or below `end`, and none above. A scope the
//! backup says is not exact (a table without a change stream, a tail the log no
//! longer held) must hold each row somewhere between the oracle's at `start` and
//! at the cut.

use super::*;
use metrics::{BackupSummary, ScopeBackupSummary};
use pangea_core::changes::{self, ChangesError, Cursor, Query, Stream};

/// Rows per scan page and changes per change-stream page (`pangea backup`'s).
const PAGE: usize = 1_000;
/// Replicas tried for one scope before the backup fails (`pangea backup`'s).
const ATTEMPTS_MAX: usize = 3;
/// The cut's first look, and then how often it looks again and for how long
/// (`pangea backup`'s: a group commit or two).
const CUT_FIRST: SimDuration = SimDuration::from_ms(200);
const CUT_POLL: SimDuration = SimDuration::from_ms(100);
const CUT_WAIT_MAX: SimDuration = SimDuration::from_ms(10_000);
/// How often a tail that has not reached the cut asks again, and for how long.
const TAIL_POLL: SimDuration = SimDuration::from_ms(50);
const TAIL_WAIT_MAX: SimDuration = SimDuration::from_ms(30_000);
/// A change-stream page's bounds at the replica (the node's).
const CHANGES_SCAN_MAX: usize = 20_000;
const CHANGES_BYTES_MAX: usize = 4 << 20;

/// One `backup` fault's run.
#[derive(Debug)]
pub(super) struct BackupJob {
    /// Region index of the tool.
    region: usize,
    deadline: SimDuration,
    /// Tables backed up (every table of the placement but the system's).
    tables: Vec<Arc<str>>,
    /// Its lines in the report: `Simulation::backup_summaries` at the same index.
    scopes: Vec<ScopeJob>,
}

#[derive(Debug)]
struct ScopeJob {
    scope: usize,
    /// Replica indices, nearest first; `at` is the one read now.
    sources: Vec<usize>,
    at: usize,
    /// The call in flight: answers and timeouts of older calls are stale.
    call: u32,
    step: Step,
    /// The answer on its way back to the tool.
    answer: Option<Answer>,
    got: Got,
    done: bool,
}

#[derive(Debug)]
enum Step {
    Start,
    Rows {
        table: usize,
        after: Option<Bytes>,
    },
    Cut {
        since: SimTime,
    },
    Tail {
        table: usize,
        cursor: Cursor,
        since: SimTime,
    },
}

/// What one scope's reading has gathered from its current replica.
#[derive(Debug, Default)]
struct Got {
    start: Option<ScopeWatermarks>,
    end: Option<ScopeWatermarks>,
    rows: BTreeMap<(Arc<str>, Bytes), RowState>,
    /// Newest timestamp of each origin the rows showed: the cut must cover it.
    newest: BTreeMap<ReplicaId, u64>,
    tail: Vec<changes::Change>,
    /// Why the scope is not exact (a tail the log no longer held).
    inexact: Vec<String>,
}

#[derive(Debug)]
enum Answer {
    Watermarks(Option<ScopeWatermarks>),
    /// The scope's rows of a page, and the key to resume after (the page's
    /// last, whichever scope it is in) when the page was full.
    Rows(Vec<(Bytes, RowState)>, Option<Bytes>),
    Changes(changes::Page),
    Expired(String),
    Refused(String),
}

/// A bug put in on purpose, which C10 must catch (tests).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bug {
    /// The tail's changes are left out.
    DropsTail,
    /// The first row of every page is left out.
    DropsRows,
}

/// What the tool does after an answer.
enum Next {
    Send,
    Later(SimDuration),
    Done,
    Failed(String),
    FailOver(String),
}

/// Where a backup call's event happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BackupAt {
    /// The request reaches the replica.
    Replica,
    /// The answer reaches the tool.
    Tool,
    /// The call's deadline passed.
    Timeout,
    /// The tool sends the scope's next call (after a wait).
    Send,
}

impl Simulation {
    /// The `backup` fault `i`: plans the scopes and sends each its first call.
    pub(super) fn start_backup(
        &mut self,
        i: usize,
        region: &RegionId,
        app_profile: &str,
        policies: &[String],
        deadline: SimDuration,
    ) {
        let label = self.sc.faults[i].label.clone();
        let d = self.views[self.client_view].clone();
        let Some(ri) = self.net.region_idx(region) else {
            return;
        };
        let tables: Vec<Arc<str>> = d
            .placement
            .schema
            .tables
            .keys()
            .filter(|t| !t.starts_with('_'))
            .map(|t| Arc::from(t.as_ref()))
            .collect();
        let mut summary = BackupSummary {
            label: label.clone(),
            region: region.to_string(),
            start_s: self.now.as_secs_f64(),
            end_s: None,
            scopes: Vec::new(),
            skipped: Vec::new(),
        };
        let mut scopes = Vec::new();
        for scope in d.scopes() {
            if !policies.is_empty() && !policies.iter().any(|p| p == scope.policy()) {
                continue;
            }
            // Residency: a backup is stored where it is made.
            if !d
                .placement
                .policy(scope)
                .is_some_and(|p| p.regions.contains(region))
            {
                summary.skipped.push(format!(
                    "{scope}: policy {} does not include {region}",
                    scope.policy()
                ));
                continue;
            }
            let Some(s) = self.scopes.get(scope.as_str()) else {
                continue;
            };
            let sources: Vec<usize> = d
                .scope_sources(scope, region, app_profile)
                .iter()
                .filter_map(|id| self.names.get(id.as_str()))
                .collect();
            summary.scopes.push(ScopeBackupSummary {
                scope: scope.to_string(),
                ..ScopeBackupSummary::default()
            });
            scopes.push(ScopeJob {
                scope: s,
                sources,
                at: 0,
                call: 0,
                step: Step::Start,
                answer: None,
                got: Got::default(),
                done: false,
            });
        }
        self.backup_summaries.push(summary);
        let j = self.backups.len();
        self.backups.push(BackupJob {
            region: ri,
            deadline,
            tables,
            scopes,
        });
        if self.backups[j].scopes.is_empty() {
            self.checks.other_violations += 1;
            self.checks
                .violation(format!("C10: {label}: nothing to back up from {region}"));
            self.backup_summaries[j].end_s = Some(self.now.as_secs_f64());
            return;
        }
        for s in 0..self.backups[j].scopes.len() {
            if self.backups[j].scopes[s].sources.is_empty() {
                self.scope_failed(j, s, "no replica may serve it to this app profile".into());
            } else {
                self.backup_send(j, s);
            }
        }
    }

    /// C10 at the end of the run: a backup still running did not finish.
    pub(super) fn unfinished_backups(&mut self) {
        for b in &self.backup_summaries {
            for line in b.scopes.iter().filter(|l| l.state.is_empty()) {
                self.checks.other_violations += 1;
                self.checks.violation(format!(
                    "C10: {}: scope {} had not finished when the run ended",
                    b.label, line.scope
                ));
            }
        }
    }

    /// Whether every backup has finished (the run's drain waits for them).
    pub(super) fn backups_finished(&self) -> bool {
        self.backups.iter().all(|b| b.scopes.iter().all(|s| s.done))
    }

    pub(super) fn on_backup(&mut self, j: usize, s: usize, call: u32, at: BackupAt) {
        let Some(sj) = self.backups.get(j).and_then(|b| b.scopes.get(s)) else {
            return;
        };
        if sj.done || sj.call != call {
            return; // a call already answered, timed out or failed over
        }
        match at {
            BackupAt::Send => self.backup_send(j, s),
            BackupAt::Replica => self.backup_serve(j, s),
            BackupAt::Tool => self.backup_answer(j, s),
            BackupAt::Timeout => {
                let (b, r) = (&self.backups[j], self.backups[j].scopes[s].replica());
                let why = format!(
                    "no answer from {} within {} ms",
                    self.nodes[r].id,
                    b.deadline.as_us() / 1_000
                );
                self.fail_over(j, s, why);
            }
        }
    }

    /// Sends the scope's next call to its replica, with its deadline.
    fn backup_send(&mut self, j: usize, s: usize) {
        let (region, deadline) = (self.backups[j].region, self.backups[j].deadline);
        let sj = &mut self.backups[j].scopes[s];
        sj.call += 1;
        let (call, r) = (sj.call, sj.replica());
        self.queue.push(
            self.now + deadline,
            Ev::Backup {
                job: j as u32,
                scope: s as u32,
                call,
                at: BackupAt::Timeout,
            },
        );
        if let Some(d) = self.client_path(region, r, true) {
            self.queue.push(
                self.now + d,
                Ev::Backup {
                    job: j as u32,
                    scope: s as u32,
                    call,
                    at: BackupAt::Replica,
                },
            );
        }
    }

    /// Schedules the scope's next call after `wait`.
    fn backup_later(&mut self, j: usize, s: usize, wait: SimDuration) {
        let sj = &mut self.backups[j].scopes[s];
        sj.call += 1;
        self.queue.push(
            self.now + wait,
            Ev::Backup {
                job: j as u32,
                scope: s as u32,
                call: sj.call,
                at: BackupAt::Send,
            },
        );
    }

    /// The request reaches the replica: it answers as the node does, once its
    /// host has done the work, unless it cannot be reached.
    fn backup_serve(&mut self, j: usize, s: usize) {
        let region = self.backups[j].region;
        let r = self.backups[j].scopes[s].replica();
        if self
            .net
            .path_state(region, self.nodes[r].region)
            .is_some_and(|p| p.cut)
            || self.nodes[r].paused > 0
        {
            return; // dropped in flight, or held: the deadline finds it out
        }
        let node = &self.nodes[r];
        let (answer, items, bytes) = match node.replica.as_ref() {
            None if node.silent > 0 => return, // a lost host: silence
            None => (
                Answer::Refused(format!("{} refused the connection", node.id)),
                0,
                0,
            ),
            Some(_) if node.gate.is_some() => (
                Answer::Refused(format!("{} is catching up (unavailable)", node.id)),
                0,
                0,
            ),
            Some(rep) => self.backup_read(rep, j, s),
        };
        let cost = self.nodes[r].host.model().snapshot;
        let done = if items > 0 {
            self.nodes[r]
                .host
                .run(self.now, Work::Snapshot, cost, items, bytes)
        } else {
            self.now
        };
        let done = done + self.nodes[r].host.overhead();
        if let Some(d) = self.client_path(region, r, false) {
            let sj = &mut self.backups[j].scopes[s];
            sj.answer = Some(answer);
            self.queue.push(
                done + d,
                Ev::Backup {
                    job: j as u32,
                    scope: s as u32,
                    call: sj.call,
                    at: BackupAt::Tool,
                },
            );
        }
    }

    /// What replica `rep` answers to the scope's current call, with the items
    /// and bytes its host works through.
    fn backup_read(&self, rep: &Replica<MemStorage>, j: usize, s: usize) -> (Answer, usize, usize) {
        let b = &self.backups[j];
        let sj = &b.scopes[s];
        let scope = &self.scope_ids[sj.scope];
        match &sj.step {
            Step::Start | Step::Cut { .. } => (Answer::Watermarks(rep.watermarks(scope)), 0, 0),
            Step::Rows { table, after } => {
                let table = &b.tables[*table];
                match rep.storage().scan_rows(table, b"", after.as_deref(), PAGE) {
                    Ok(rows) => {
                        let n = rows.len();
                        let bytes = rows.iter().map(|(_, r)| r.value_bytes()).sum();
                        let resume = (n == PAGE)
                            .then(|| rows.last().map(|(k, _)| k.clone()))
                            .flatten();
                        // The tool keeps its scope's rows.
                        let mine = rows
                            .into_iter()
                            .filter(|(k, _)| &rep.scope_of(table, k) == scope)
                            .collect();
                        (Answer::Rows(mine, resume), n, bytes)
                    }
                    Err(e) => (Answer::Refused(format!("{}: {e}", rep.id())), 0, 0),
                }
            }
            Step::Tail { table, cursor, .. } => {
                let streams: Vec<Stream> = rep
                    .watermarks(scope)
                    .map(|w| Stream::of(&w).collect())
                    .unwrap_or_default();
                let q = Query {
                    table: &b.tables[*table],
                    prefix: b"",
                    limit: PAGE,
                    scan_max: CHANGES_SCAN_MAX,
                    bytes_max: CHANGES_BYTES_MAX,
                };
                match changes::read(rep.storage(), &streams, cursor, &q) {
                    Ok(page) => {
                        let n = page.changes.len();
                        let bytes = page
                            .changes
                            .iter()
                            .map(|c| c.mutation.payload_bytes())
                            .sum();
                        (Answer::Changes(page), n, bytes)
                    }
                    Err(e @ ChangesError::Expired { .. }) => {
                        (Answer::Expired(format!("{}: {e}", rep.id())), 0, 0)
                    }
                    Err(e) => (Answer::Refused(format!("{}: {e}", rep.id())), 0, 0),
                }
            }
        }
    }

    /// The answer reaches the tool: the scope's next step.
    fn backup_answer(&mut self, j: usize, s: usize) {
        let Some(answer) = self.backups[j].scopes[s].answer.take() else {
            return;
        };
        match self.advance(j, s, answer) {
            Next::Send => self.backup_send(j, s),
            Next::Later(wait) => self.backup_later(j, s, wait),
            Next::Done => self.scope_done(j, s),
            Next::Failed(why) => self.scope_failed(j, s, why),
            Next::FailOver(why) => self.fail_over(j, s, why),
        }
    }

    /// Takes `answer` into the scope's state (`pangea_ops::backup::create`'s
    /// steps) and says what the tool does next.
    fn advance(&mut self, j: usize, s: usize, answer: Answer) -> Next {
        let now = self.now;
        let schema = &self.views[self.client_view].placement.schema;
        let b = &mut self.backups[j];
        let tables = &b.tables;
        let sj = &mut b.scopes[s];
        let replica = &self.nodes[sj.sources[sj.at]].id;
        let scope = &self.scope_ids[sj.scope];
        // The tail of the first table from `from` on that has a change stream.
        let tail_from = |from: usize, got: &Got| {
            let table = (from..tables.len()).find(|t| {
                schema
                    .table(&tables[*t])
                    .is_some_and(|t| t.change_retention_ms.is_some())
            })?;
            Some(Step::Tail {
                table,
                cursor: cursor_at(got.start.as_ref().expect("read first")),
                since: now,
            })
        };
        let got = &mut sj.got;
        match (answer, &mut sj.step) {
            (Answer::Refused(why), _) => return Next::FailOver(why),
            (Answer::Watermarks(None), _) => {
                return Next::FailOver(format!("{replica} reported no watermarks of {scope}"));
            }
            (Answer::Watermarks(Some(w)), Step::Start) => {
                got.start = Some(w);
                sj.step = Step::Rows {
                    table: 0,
                    after: None,
                };
            }
            (Answer::Rows(rows, resume), Step::Rows { table, after }) => {
                let t = &tables[*table];
                #[cfg(test)]
                let rows = match self.backup_bug {
                    Some(Bug::DropsRows) => rows.into_iter().skip(1).collect(),
                    _ => rows,
                };
                for (key, row) in rows {
                    for v in row.versions() {
                        let n = got.newest.entry(v.origin.clone()).or_default();
                        *n = (*n).max(v.timestamp.as_u64());
                    }
                    got.rows.insert((t.clone(), key), row);
                }
                if resume.is_some() {
                    *after = resume;
                } else if *table + 1 < tables.len() {
                    sj.step = Step::Rows {
                        table: *table + 1,
                        after: None,
                    };
                } else {
                    sj.step = Step::Cut { since: now };
                    return Next::Later(CUT_FIRST);
                }
            }
            (Answer::Watermarks(Some(w)), Step::Cut { since }) => {
                let covered = got
                    .newest
                    .iter()
                    .all(|(origin, ts)| w.get(origin).timestamp.as_u64() >= *ts);
                if !covered {
                    if now - *since >= CUT_WAIT_MAX {
                        return Next::Failed(format!(
                            "{replica}'s durable watermarks did not reach the versions its \
                             rows showed within {} s",
                            CUT_WAIT_MAX.as_us() / 1_000_000
                        ));
                    }
                    return Next::Later(CUT_POLL);
                }
                got.end = Some(w);
                let Some(step) = tail_from(0, got) else {
                    got.inexact.push("no table has a change stream".into());
                    return Next::Done;
                };
                sj.step = step;
            }
            (
                Answer::Changes(page),
                Step::Tail {
                    table,
                    cursor,
                    since,
                },
            ) => {
                let end = got.end.as_ref().expect("cut first");
                #[cfg(test)]
                let page = changes::Page {
                    changes: match self.backup_bug {
                        Some(Bug::DropsTail) => Vec::new(),
                        _ => page.changes,
                    },
                    ..page
                };
                for c in page.changes {
                    if &c.scope == scope && c.sequence <= end.get(&c.origin).sequence {
                        got.tail.push(c);
                    }
                }
                *cursor = page.cursor;
                let reached = end
                    .iter()
                    .all(|(origin, m)| cursor.position(scope, origin) >= m.sequence);
                if reached {
                    let Some(step) = tail_from(*table + 1, got) else {
                        return Next::Done;
                    };
                    sj.step = step;
                } else if !page.more {
                    if now - *since >= TAIL_WAIT_MAX {
                        return Next::Failed(format!(
                            "{replica}'s change stream did not reach the cut within {} s",
                            TAIL_WAIT_MAX.as_us() / 1_000_000
                        ));
                    }
                    return Next::Later(TAIL_POLL);
                }
            }
            (Answer::Expired(why), Step::Tail { table, .. }) => {
                got.inexact.push(format!(
                    "table {}: the log no longer held the tail ({why})",
                    tables[*table]
                ));
                let Some(step) = tail_from(*table + 1, got) else {
                    return Next::Done;
                };
                sj.step = step;
            }
            (a, step) => {
                return Next::Failed(format!("answer {a:?} does not fit step {step:?}"));
            }
        }
        Next::Send
    }

    /// The scope's replica failed it: the next one reads it from the start.
    fn fail_over(&mut self, j: usize, s: usize, why: String) {
        let sj = &mut self.backups[j].scopes[s];
        let line = &mut self.backup_summaries[j].scopes[s];
        line.failovers.push(why.clone());
        sj.at += 1;
        if sj.at >= sj.sources.len() || sj.at >= ATTEMPTS_MAX {
            let why = format!("{} replicas failed, the last: {why}", sj.at);
            return self.scope_failed(j, s, why);
        }
        sj.got = Got::default();
        sj.step = Step::Start;
        self.backup_send(j, s);
    }

    fn scope_failed(&mut self, j: usize, s: usize, why: String) {
        let sj = &mut self.backups[j].scopes[s];
        sj.done = true;
        sj.call += 1;
        let line = &mut self.backup_summaries[j].scopes[s];
        line.state = format!("failed: {why}");
        line.end_s = Some(self.now.as_secs_f64());
        let label = self.backup_summaries[j].label.clone();
        self.checks.other_violations += 1;
        self.checks.violation(format!(
            "C10: {label}: scope {} failed: {why}",
            self.scope_ids[sj.scope]
        ));
        self.backup_job_ended(j);
    }

    /// The scope is read: its summary, and C10.
    fn scope_done(&mut self, j: usize, s: usize) {
        let sj = &mut self.backups[j].scopes[s];
        sj.done = true;
        sj.call += 1;
        let got = std::mem::take(&mut sj.got);
        let (scope, replica) = (sj.scope, sj.replica());
        let line = &mut self.backup_summaries[j].scopes[s];
        line.replica = self.nodes[replica].id.to_string();
        line.rows = got.rows.len() as u64;
        line.changes = got.tail.len() as u64;
        line.exact = got.inexact.is_empty();
        line.note = got.inexact.join("; ");
        line.end_s = Some(self.now.as_secs_f64());
        line.cut = got
            .end
            .as_ref()
            .map(|w| {
                w.iter()
                    .filter(|(_, m)| m.sequence > 0)
                    .map(|(o, m)| (o.to_string(), m.sequence))
                    .collect()
            })
            .unwrap_or_default();
        let checked = self.check_backup(scope, got);
        let line = &mut self.backup_summaries[j].scopes[s];
        match checked {
            Ok(rows) => {
                line.rows_checked = rows;
                line.state = "done".into();
            }
            Err(why) => {
                line.state = format!("wrong: {why}");
                let label = self.backup_summaries[j].label.clone();
                self.checks.other_violations += 1;
                self.checks.violation(format!(
                    "C10: {label}: scope {}: {why}",
                    self.scope_ids[scope]
                ));
            }
        }
        self.backup_job_ended(j);
    }

    fn backup_job_ended(&mut self, j: usize) {
        if self.backups[j].scopes.iter().all(|s| s.done) {
            self.backup_summaries[j].end_s = Some(self.now.as_secs_f64());
        }
    }

    /// C10: the scope's rows with its tail merged are exactly the oracle's as of
    /// the cut; a scope without its whole tail holds each row somewhere between
    /// the oracle's at `start` and at the cut. Returns the rows compared.
    fn check_backup(&self, scope: usize, got: Got) -> std::result::Result<u64, String> {
        let schema = &self.views[self.client_view].placement.schema;
        let Got {
            start: Some(start),
            end: Some(end),
            rows: mut backup,
            tail,
            inexact,
            ..
        } = got
        else {
            return Err("no cut".into());
        };
        for c in &tail {
            apply(&mut backup, &c.mutation, c.timestamp, &c.origin, schema);
        }
        let hi = self.oracle_at(scope, &end)?;
        let lo = match inexact.is_empty() {
            true => None,
            false => Some(self.oracle_at(scope, &start)?),
        };
        let now_ms = self.now_wall_ms();
        let visible = |k: &(Arc<str>, Bytes), row: Option<&RowState>| {
            row.and_then(|r| r.visible_digest(&k.1, schema.table(&k.0), now_ms))
        };
        // Whether `small` adds nothing visible to `big`.
        let within = |k: &(Arc<str>, Bytes), small: Option<&RowState>, big: Option<&RowState>| {
            let Some(small) = small else {
                return true;
            };
            let mut joined = big.cloned().unwrap_or_default();
            joined.merge(small, schema.table(&k.0));
            visible(k, Some(&joined)) == visible(k, big)
        };
        let keys: std::collections::BTreeSet<&(Arc<str>, Bytes)> =
            backup.keys().chain(hi.keys()).collect();
        let (mut wrong, mut first) = (0u64, None);
        for k in &keys {
            let (b, h) = (backup.get(*k), hi.get(*k));
            let problem = match &lo {
                None if visible(k, b) != visible(k, h) => {
                    Some(("the writes up to the cut make", h))
                }
                Some(_) if !within(k, b, h) => {
                    Some(("it holds more than the writes up to the cut,", h))
                }
                Some(lo) if !within(k, lo.get(*k), b) => {
                    Some(("it lacks writes before its start, which make", lo.get(*k)))
                }
                _ => None,
            };
            if let Some((p, other)) = problem {
                wrong += 1;
                first.get_or_insert_with(|| {
                    format!(
                        "{}/{}: the backup has {}; {p} {}",
                        k.0,
                        pangea_core::redact::RedactedKey(&k.1),
                        show(b),
                        show(other)
                    )
                });
            }
        }
        match first {
            None => Ok(keys.len() as u64),
            Some(f) => Err(format!(
                "{wrong} of {} rows are not the writes up to the cut; the first: {f}",
                keys.len()
            )),
        }
    }

    /// The scope's rows as of `cut`: every durable write of its streams at or
    /// below it, applied to empty rows (the system tables left out).
    fn oracle_at(
        &self,
        scope: usize,
        cut: &ScopeWatermarks,
    ) -> std::result::Result<BTreeMap<(Arc<str>, Bytes), RowState>, String> {
        let schema = &self.views[self.client_view].placement.schema;
        let mut rows = BTreeMap::new();
        for (origin, m) in cut.iter() {
            let o = self
                .names
                .get(origin.as_str())
                .ok_or_else(|| format!("unknown origin {origin}"))?;
            let log = &self.checks.log[self.checks.stream(scope, o)];
            for seq in 1..=m.sequence {
                let Some(Some(e)) = log.get(seq as usize - 1) else {
                    return Err(format!(
                        "the cut covers {origin}#{seq}, which no replica made durable"
                    ));
                };
                if !e.mutation.table().starts_with('_') {
                    apply(&mut rows, &e.mutation, e.timestamp, &e.origin, schema);
                }
            }
        }
        Ok(rows)
    }
}

/// Applies one write to its row of `rows`.
fn apply(
    rows: &mut BTreeMap<(Arc<str>, Bytes), RowState>,
    m: &RowMutation,
    timestamp: Timestamp,
    origin: &ReplicaId,
    schema: &pangea_topology::schema::Schema,
) {
    rows.entry((m.table().clone(), m.row_key().clone()))
        .or_default()
        .apply(
            &m.cell_version(&Version::new(timestamp, origin.clone())),
            m.mutations(),
            schema.table(m.table()),
        );
}

impl ScopeJob {
    fn replica(&self) -> usize {
        self.sources[self.at]
    }
}

/// A cursor at a scope's watermarks.
fn cursor_at(w: &ScopeWatermarks) -> Cursor {
    Cursor::at(&Stream::of(w).collect::<Vec<_>>())
}

fn show(row: Option<&RowState>) -> String {
    match row {
        None => "no row".into(),
        Some(r) => format!("{} versions", r.versions().count()),
    }
}
