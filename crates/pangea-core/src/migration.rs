//! Placement migration jobs, sans-IO: move the rows of a table under a key prefix
//! from one placement policy to another with no downtime (docs/placement.md).
//!
//! A [`Job`] is stepped by the driver of the replica running it (the node's driver
//! task, the simulator's event loop) with that replica's core: it proposes its
//! writes there, scans the rows from its store and reads the cluster's progress
//! from the heartbeats' gossip. It holds no clock, no task and no channel. It goes
//! through these phases, each checkpointed in the `_jobs` system table
//! (replicated, durable), so it resumes after a crash of its replica
//! ([`resumable`]):
//!
//! 1. **planned → dual-write**: a `_location` entry marks the prefix as migrating;
//!    from then on every replica routes writes of those rows into both policies'
//!    streams (only replicas of both accept them). The job waits until every
//!    replica has applied the entry, then counts the rows.
//! 2. **backfill**: the job copies each existing row's state into the new policy's
//!    stream (`MergeRow`, which keeps every version's own timestamp and origin, so
//!    copying twice or racing a dual write is harmless), checkpointing its position.
//! 3. **flip**: once every replica of the new policy has applied the new scope's
//!    streams as far as the runner has (the backfill and the dual writes it saw: the
//!    flip travels in another stream and could otherwise overtake them), a new
//!    `_location` entry puts the rows in the new policy; the job waits until every
//!    replica has applied it. Replicas outside the new policy then purge the rows
//!    from their stores ([`Replica::purge_moved_rows`]); reads and writes go to the
//!    new policy's replicas.
//! 4. **done** (or **failed**, with the error, on a refused write).
//!
//! Every wait is on the job's own writes becoming durable here or on the other
//! replicas' reports, so a replica that is down stalls the job (it resumes when
//! the replica is back or leaves the topology); nothing is skipped.
//!
//! On a runner replica of many processes each process holds only its shard
//! groups' rows (docs/sharding.md). The job runs on process 0, which writes the
//! location entries; when its backfill starts it records one **part** per other
//! process (`_jobs` rows `<id>.p<k>`, [`pb::MigrationJob::part_of`]), which that
//! process takes up as it applies the row ([`Replica::take_assigned_jobs`]) and
//! runs as the same state machine without the location writes: count, backfill
//! and catch-up of its own groups, then done. The job flips only once every part
//! is done (and fails if one fails).

use crate::location::{
    JOBS_COLUMN, JOBS_FAMILY, JOBS_TABLE, LOCATION_COLUMN, LOCATION_FAMILY, LOCATION_TABLE,
    LocationEntry, location_key,
};
use crate::replica::{Now, Replica};
use crate::{Error, Limits, Mutation, ReplicaId, RowMutation, ScopeId, Storage, Token};
use bytes::Bytes;
use pangea_proto::Message;
use pangea_proto::v1 as pb;
use pangea_topology::{Deployment, process_id};

/// Rows copied per step (and per checkpoint): one group commit.
pub const BACKFILL_BATCH_ROWS: usize = 100;
/// Rows counted per step, before the backfill.
pub const COUNT_PAGE_ROWS: usize = 1_000;

/// A move an operator asked for (`pangea placement move`, or a placement file
/// whose rules changed).
#[derive(Debug, Clone)]
pub struct Request {
    pub table: String,
    pub prefix: Bytes,
    /// The placement policy the rows move to.
    pub to: String,
    /// The rows' new home region (empty: keep the current one where the new policy
    /// has it).
    pub home: String,
}

/// Why a move was refused before it started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("unknown table {0:?}")]
    UnknownTable(String),
    #[error("unknown placement policy {0:?}")]
    UnknownPolicy(String),
    #[error("home region {home:?} is not in policy {policy:?}")]
    HomeOutsidePolicy { home: String, policy: String },
    #[error("no replica of policy {0:?} stores rows: the move would leave them nowhere")]
    NoReplicaStores(String),
    #[error(
        "policy {to:?} would put rows of {table:?} under {prefix} in regions outside policy \
         {bound:?}, which the placement file gives them; widen residency by editing the \
         placement file (pangea topology apply), not with a move"
    )]
    EscapesResidency {
        to: String,
        table: String,
        /// Redacted.
        prefix: String,
        bound: String,
    },
    #[error("rows of {table:?} under {prefix:?} are already in policy {policy:?}")]
    AlreadyThere {
        table: String,
        prefix: String,
        policy: String,
    },
    #[error(
        "replica {replica} is not in both policies {from:?} and {to:?}; run the move on a \
         replica of both (or move through \"global\" in two steps)"
    )]
    RunnerOutside {
        replica: String,
        from: String,
        to: String,
    },
    #[error(
        "replica {0} is being resized (pangea cluster resize): move the rows once the resize \
         has finished"
    )]
    Resizing(String),
}

/// What a step of a job left to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// It proposed writes or moved on: step it again right after the next flush.
    Again,
    /// It waits on other replicas: step it again when they report (any later turn).
    Waiting,
    /// Done or failed, and its last checkpoint durable: drop it.
    Finished,
}

/// One migration job, run by this replica.
#[derive(Debug)]
pub struct Job {
    record: pb::MigrationJob,
    stage: Stage,
    wait: Wait,
    /// Whether the job's first checkpoint is durable (a caller may be told its id).
    recorded: bool,
}

/// Where the job is inside its phase (not checkpointed: a resumed job starts its
/// phase over, and every step of a phase may run twice).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stage {
    Start,
    /// Counting the rows: the count so far and the last key counted.
    Counting {
        rows: u64,
        after: Option<Bytes>,
    },
    /// The new policy's replicas hold everything this one had applied: flip.
    CaughtUp,
    /// The flip entry is everywhere.
    Flipped,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Wait {
    Nothing,
    /// This replica's own writes, until they are durable here.
    Durable(Vec<Token>),
    /// Until every member of each scope has applied each origin's stream that far.
    Everywhere(Vec<(ScopeId, ReplicaId, u64)>),
}

impl Job {
    /// Checks a move and plans it, run by `replica` (`files` is the deployment as
    /// the files declare it: residency is theirs). The job's first step records it.
    pub fn plan<S: Storage>(
        replica: &Replica<S>,
        files: &Deployment,
        req: Request,
        now: Now,
    ) -> Result<Job, Refused> {
        let d = replica.deployment();
        if d.placement.schema.table(&req.table).is_none() || req.table.starts_with('_') {
            return Err(Refused::UnknownTable(req.table));
        }
        // The job's parts are one per process of the runner's replica: a resize
        // would change which process holds which rows under them.
        if let Some(r) = d.topology.replica(replica.id().as_str())
            && r.resize.is_some()
        {
            return Err(Refused::Resizing(r.of.to_string()));
        }
        let to = ScopeId::from(req.to.as_str());
        let Some(policy) = d.placement.policy(&to) else {
            return Err(Refused::UnknownPolicy(req.to));
        };
        if !req.home.is_empty() && !policy.regions.iter().any(|r| r.as_str() == req.home) {
            return Err(Refused::HomeOutsidePolicy {
                home: req.home,
                policy: req.to,
            });
        }
        if !d
            .topology
            .replicas
            .values()
            .any(|r| r.role.stores_rows() && d.allowed(&r.id, &to))
        {
            return Err(Refused::NoReplicaStores(req.to));
        }
        // Residency is the placement file's: a move may narrow where rows live,
        // never widen it (that is an edit of the file, reviewed and applied).
        if let Some(bound) = crate::location::escapes_residency(files, &req.table, &req.prefix, &to)
        {
            return Err(Refused::EscapesResidency {
                to: req.to,
                table: req.table,
                prefix: crate::redact::RedactedKey(&req.prefix).to_string(),
                bound: bound.to_string(),
            });
        }
        // The policy in force at the prefix (its scope names the prefix's shard
        // group too, which says nothing about the rows under it).
        let from = ScopeId::from(replica.scope_of(&req.table, &req.prefix).policy());
        if from == to {
            return Err(Refused::AlreadyThere {
                prefix: String::from_utf8_lossy(&req.prefix).into_owned(),
                table: req.table,
                policy: req.to,
            });
        }
        let me = replica.id();
        if !d.allowed(me, &from) || !d.allowed(me, &to) {
            return Err(Refused::RunnerOutside {
                replica: me.to_string(),
                from: from.to_string(),
                to: req.to,
            });
        }
        let now_ms = now.wall_ms as i64;
        let record = pb::MigrationJob {
            id: format!("{}:{}:{now_ms}", req.table, hex(&req.prefix)),
            table: req.table,
            prefix: req.prefix,
            from_policy: from.to_string(),
            to_policy: req.to,
            home_region: req.home,
            runner: me.to_string(),
            phase: "planned".into(),
            started_unix_ms: now_ms,
            ..Default::default()
        };
        Ok(Job {
            record,
            // The first step checkpoints the plan before anything else.
            stage: Stage::Start,
            wait: Wait::Nothing,
            recorded: false,
        })
    }

    /// A job recorded in `_jobs` (by this replica, or a part its process 0
    /// recorded for it), taken up where its checkpoint says.
    pub fn resumed(record: pb::MigrationJob) -> Job {
        Job {
            record,
            stage: Stage::Start,
            wait: Wait::Nothing,
            recorded: true,
        }
    }

    /// The job's checkpoint as it stands (what `pangea placement jobs` shows).
    pub fn record(&self) -> &pb::MigrationJob {
        &self.record
    }

    pub fn id(&self) -> &str {
        &self.record.id
    }

    /// Whether this is a part of a job run by another process of this replica.
    fn is_part(&self) -> bool {
        !self.record.part_of.is_empty()
    }

    /// Whether the job's first checkpoint is durable here: from then on it runs to
    /// its end, through crashes of this replica.
    pub fn is_recorded(&self) -> bool {
        self.recorded
    }

    /// Runs the job as far as it can go now on `replica`. An error is the store's
    /// (the driver reopens it, and [`resumable`] picks the job up again); a write
    /// the core refuses fails the job instead, recorded with its reason.
    pub fn step<S: Storage>(
        &mut self,
        replica: &mut Replica<S>,
        now: Now,
    ) -> Result<Progress, Error> {
        loop {
            match &self.wait {
                Wait::Nothing => {}
                Wait::Durable(tokens) => {
                    if !tokens.iter().all(|t| replica.is_durable(t)) {
                        return Ok(Progress::Again);
                    }
                    self.recorded = true;
                }
                Wait::Everywhere(streams) => {
                    if !streams
                        .iter()
                        .all(|(s, o, seq)| replica.applied_everywhere(s, o, *seq))
                    {
                        return Ok(Progress::Waiting);
                    }
                }
            }
            self.wait = Wait::Nothing;
            if matches!(self.record.phase.as_str(), "done" | "failed") {
                return Ok(Progress::Finished);
            }
            if !self.recorded {
                let token = self.save(replica, now)?;
                self.wait = Wait::Durable(vec![token]);
                continue;
            }
            match self.advance(replica, now) {
                Ok(progress) => return Ok(progress),
                Err(e @ Error::Storage(_)) => return Err(e),
                Err(e) => {
                    self.record.phase = "failed".into();
                    self.record.error = e.to_string();
                    let token = self.save(replica, now)?;
                    self.wait = Wait::Durable(vec![token]);
                    return Ok(Progress::Again);
                }
            }
        }
    }

    /// One step of the current phase (nothing to wait for).
    fn advance<S: Storage>(
        &mut self,
        replica: &mut Replica<S>,
        now: Now,
    ) -> Result<Progress, Error> {
        let to = ScopeId::from(self.record.to_policy.as_str());
        let part = self.is_part();
        match (self.record.phase.as_str(), &mut self.stage) {
            // A part's job already put the rows in dual-write everywhere.
            ("planned", Stage::Start) if part => {
                self.stage = Stage::Counting {
                    rows: 0,
                    after: None,
                };
                Ok(Progress::Again)
            }
            ("planned", Stage::Start) => {
                let from = self.record.from_policy.clone();
                let to = self.record.to_policy.clone();
                let token = self.write_location(replica, now, &from, &to, "")?;
                self.wait = Wait::Everywhere(vec![(token.scope, token.origin, token.sequence)]);
                self.stage = Stage::Counting {
                    rows: 0,
                    after: None,
                };
                Ok(Progress::Waiting)
            }
            ("planned", Stage::Counting { rows, after }) => {
                let (table, prefix) = (&self.record.table, &self.record.prefix);
                let mut page = 0u64;
                let last = replica.storage().visit_rows(
                    table,
                    prefix,
                    after.as_deref(),
                    COUNT_PAGE_ROWS,
                    &mut |key, _| page += u64::from(copies_here(replica, &to, table, key)),
                )?;
                *rows += page;
                match last {
                    Some(last) => *after = Some(last),
                    None => {
                        self.record.rows_total = *rows;
                        self.record.phase = "backfill".into();
                        self.stage = Stage::Start;
                        let parts = self.record_parts(replica, now)?;
                        self.checkpoint(replica, now, parts)?;
                    }
                }
                Ok(Progress::Again)
            }
            ("backfill", _) => {
                let after = (!self.record.backfill_after.is_empty())
                    .then(|| self.record.backfill_after.clone());
                let rows = replica.storage().scan_rows(
                    &self.record.table,
                    &self.record.prefix,
                    after.as_deref(),
                    BACKFILL_BATCH_ROWS,
                )?;
                let Some((last, _)) = rows.last() else {
                    self.record.phase = "flip".into();
                    self.checkpoint(replica, now, Vec::new())?;
                    return Ok(Progress::Again);
                };
                self.record.backfill_after = last.clone();
                // The whole batch is proposed at once, so one flush covers it
                // (group commit), and checkpointed after it.
                let mut copies = Vec::new();
                for (key, row) in rows {
                    // A longer prefix with its own entry governs this row, not this job.
                    let job_id = self.record.part_of.as_str();
                    let job_id = if job_id.is_empty() {
                        &self.record.id
                    } else {
                        job_id
                    };
                    let governed = replica
                        .location()
                        .lookup(&self.record.table, &key)
                        .is_some_and(|e| e.job_id == *job_id);
                    if !governed
                        || row.is_empty()
                        || !copies_here(replica, &to, &self.record.table, &key)
                    {
                        continue;
                    }
                    let mutation = RowMutation::new(
                        self.record.table.as_str(),
                        key,
                        vec![Mutation::MergeRow(Box::new(row))],
                        &Limits::STORED,
                    )?;
                    let scope = replica
                        .deployment()
                        .group_scope(&to, &self.record.table, mutation.row_key())
                        .clone();
                    copies.push(replica.propose_in(now, &scope, mutation)?);
                }
                self.record.rows_copied += copies.len() as u64;
                self.checkpoint(replica, now, copies)?;
                Ok(Progress::Again)
            }
            ("flip", Stage::Start) => {
                // The new policy's replicas must hold every copied row before reads
                // go to them: the flip is another stream, which a replica may apply
                // before the backfill. So wait until each of them has applied, in
                // the new scope, every origin's stream as far as this replica has
                // (the backfill and the dual writes it has seen).
                let scopes = replica
                    .deployment()
                    .placement
                    .policy(&to)
                    .map(|p| p.scopes().to_vec())
                    .unwrap_or_default();
                let streams = scopes
                    .iter()
                    .filter_map(|scope| replica.watermarks(scope).map(|wm| (scope, wm)))
                    .flat_map(|(scope, wm)| {
                        wm.iter()
                            .map(|(o, w)| (scope.clone(), o.clone(), w.sequence))
                            .collect::<Vec<_>>()
                    })
                    .collect();
                self.wait = Wait::Everywhere(streams);
                self.stage = Stage::CaughtUp;
                Ok(Progress::Waiting)
            }
            ("flip", Stage::CaughtUp) if part => {
                self.record.phase = "done".into();
                self.checkpoint(replica, now, Vec::new())?;
                Ok(Progress::Again)
            }
            ("flip", Stage::CaughtUp) => {
                match self.parts(replica)? {
                    Parts::Running => return Ok(Progress::Waiting),
                    Parts::Failed(why) => {
                        self.record.phase = "failed".into();
                        self.record.error = why;
                        self.checkpoint(replica, now, Vec::new())?;
                        return Ok(Progress::Again);
                    }
                    Parts::Done { total, copied } => {
                        self.record.rows_total += total;
                        self.record.rows_copied += copied;
                    }
                }
                let home = self.record.home_region.clone();
                let to = self.record.to_policy.clone();
                let token = self.write_location(replica, now, &to, "", &home)?;
                self.wait = Wait::Everywhere(vec![(token.scope, token.origin, token.sequence)]);
                self.stage = Stage::Flipped;
                Ok(Progress::Waiting)
            }
            ("flip", Stage::Flipped) => {
                self.record.phase = "done".into();
                self.checkpoint(replica, now, Vec::new())?;
                Ok(Progress::Again)
            }
            (phase, stage) => Err(Error::Malformed {
                message: "MigrationJob",
                detail: format!("job {}: phase {phase:?} at {stage:?}", self.record.id),
            }),
        }
    }

    /// Saves the checkpoint after `writes`, and waits until all are durable.
    fn checkpoint<S: Storage>(
        &mut self,
        replica: &mut Replica<S>,
        now: Now,
        mut writes: Vec<Token>,
    ) -> Result<(), Error> {
        writes.push(self.save(replica, now)?);
        self.wait = Wait::Durable(writes);
        Ok(())
    }

    /// Proposes the job's `_jobs` row as it stands.
    fn save<S: Storage>(&mut self, replica: &mut Replica<S>, now: Now) -> Result<Token, Error> {
        save(replica, now, &mut self.record)
    }

    /// On a runner replica of many processes, records the job's parts, one per
    /// process but this one (those not recorded already: a resumed job counts
    /// again). Returns their writes.
    fn record_parts<S: Storage>(
        &mut self,
        replica: &mut Replica<S>,
        now: Now,
    ) -> Result<Vec<Token>, Error> {
        let Some(me) = replica.deployment().topology.replica(replica.id().as_str()) else {
            return Ok(Vec::new());
        };
        if self.is_part() || me.processes <= 1 {
            return Ok(Vec::new());
        }
        let (of, processes) = (me.of.clone(), me.processes);
        self.record.parts = processes;
        let mut writes = Vec::new();
        for k in 1..processes {
            let id = part_id(&self.record.id, k);
            if replica
                .storage()
                .get_row(JOBS_TABLE, id.as_bytes())?
                .is_some()
            {
                continue;
            }
            let mut part = pb::MigrationJob {
                id,
                runner: process_id(of.as_str(), k).to_string(),
                part_of: self.record.id.clone(),
                phase: "planned".into(),
                backfill_after: Bytes::new(),
                rows_copied: 0,
                rows_total: 0,
                parts: 0,
                ..self.record.clone()
            };
            writes.push(save(replica, now, &mut part)?);
        }
        Ok(writes)
    }

    /// Where the job's parts are, from their `_jobs` rows here.
    fn parts<S: Storage>(&self, replica: &Replica<S>) -> Result<Parts, Error> {
        let (mut total, mut copied, mut running) = (0, 0, false);
        for k in 1..self.record.parts {
            let key = Bytes::from(part_id(&self.record.id, k).into_bytes());
            let part = replica
                .storage()
                .get_row(JOBS_TABLE, &key)?
                .and_then(|row| crate::location::decode_job(&key, &row));
            match part {
                Some(p) if p.phase == "done" => {
                    total += p.rows_total;
                    copied += p.rows_copied;
                }
                Some(p) if p.phase == "failed" => {
                    return Ok(Parts::Failed(format!(
                        "part {} (process {}) failed: {}",
                        p.id, p.runner, p.error
                    )));
                }
                _ => running = true,
            }
        }
        Ok(if running {
            Parts::Running
        } else {
            Parts::Done { total, copied }
        })
    }

    /// Proposes the rows' location entry: `policy`, migrating to `migrating_to`
    /// (empty: not migrating), with `home` (empty: the current entry's home where
    /// it lies in `policy`).
    fn write_location<S: Storage>(
        &self,
        replica: &mut Replica<S>,
        now: Now,
        policy: &str,
        migrating_to: &str,
        home: &str,
    ) -> Result<Token, Error> {
        let job = &self.record;
        let current = replica.location().get(&job.table, &job.prefix).cloned();
        let policy_regions = replica
            .deployment()
            .placement
            .policy(&ScopeId::from(policy))
            .map(|p| p.regions.clone())
            .unwrap_or_default();
        let entry = LocationEntry {
            table: job.table.as_str().into(),
            prefix: job.prefix.clone(),
            policy: policy.into(),
            home: (!home.is_empty()).then(|| home.into()).or_else(|| {
                current
                    .as_ref()
                    .and_then(|c| c.home.clone())
                    .filter(|h| policy_regions.contains(h))
            }),
            version: current.map_or(1, |c| c.version + 1),
            migrating_to: (!migrating_to.is_empty()).then(|| migrating_to.into()),
            job_id: job.id.clone(),
        };
        let m = set(
            LOCATION_TABLE,
            location_key(&job.table, &job.prefix),
            LOCATION_FAMILY,
            LOCATION_COLUMN,
            entry.to_proto().encode_to_vec(),
        )?;
        replica.propose(now, m)
    }
}

/// Where a job's parts are.
enum Parts {
    Running,
    /// One failed: why.
    Failed(String),
    /// All done: the rows they counted and copied.
    Done {
        total: u64,
        copied: u64,
    },
}

/// The id of part `k` of job `job`.
fn part_id(job: &str, k: u32) -> String {
    format!("{job}.p{k}")
}

/// Whether this process copies `key`'s row into policy `to`: it serves the
/// row's shard group there. Always on a replica of one process; on one of many,
/// rows of the global policy's group 0, which every process holds, are copied by
/// the process that serves their group in `to` only.
fn copies_here<S: Storage>(replica: &Replica<S>, to: &ScopeId, table: &str, key: &[u8]) -> bool {
    let d = replica.deployment();
    replica.belongs_to(d.group_scope(to, table, key))
}

/// Proposes a job's `_jobs` row as it stands.
fn save<S: Storage>(
    replica: &mut Replica<S>,
    now: Now,
    record: &mut pb::MigrationJob,
) -> Result<Token, Error> {
    record.updated_unix_ms = now.wall_ms as i64;
    let m = set(
        JOBS_TABLE,
        Bytes::from(record.id.clone().into_bytes()),
        JOBS_FAMILY,
        JOBS_COLUMN,
        record.encode_to_vec(),
    )?;
    replica.propose(now, m)
}

/// The replica that runs a move from policy `from` to `to`: the smallest id of a
/// row-storing replica of both, so that every replica agrees without talking
/// (`None`: no replica is in both; the rows move through `global` in two steps).
/// Of a replica of many processes, process 0 (a shard group's scope names its
/// policy here).
pub fn runner_for(d: &Deployment, from: &ScopeId, to: &ScopeId) -> Option<ReplicaId> {
    let (from, to) = (&ScopeId::from(from.policy()), &ScopeId::from(to.policy()));
    d.topology
        .replicas
        .values()
        .filter(|r| r.role.stores_rows() && d.allowed(&r.id, from) && d.allowed(&r.id, to))
        .map(|r| r.id.clone())
        .min()
}

/// The unfinished jobs `replica` was running, from its `_jobs` table (after a
/// restart, or after its store was reopened).
pub fn resumable<S: Storage>(replica: &Replica<S>) -> Result<Vec<Job>, Error> {
    let rows = replica
        .storage()
        .scan_rows(JOBS_TABLE, b"", None, usize::MAX)?;
    Ok(rows
        .iter()
        .filter_map(|(key, row)| crate::location::decode_job(key, row))
        .filter(|j| {
            j.runner == replica.id().as_str() && !matches!(j.phase.as_str(), "done" | "failed")
        })
        .map(Job::resumed)
        .collect())
}

fn set(
    table: &str,
    key: Bytes,
    family: &str,
    column: &'static [u8],
    value: Vec<u8>,
) -> Result<RowMutation, Error> {
    let m = Mutation::SetCell {
        family: family.into(),
        column: Bytes::from_static(column),
        value: Bytes::from(value),
    };
    RowMutation::new(table, key, vec![m], &Limits::STORED)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}
