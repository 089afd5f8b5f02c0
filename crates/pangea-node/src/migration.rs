//! Placement migration jobs: move the rows of a table under a key prefix from one
//! placement policy to another with no downtime (docs/placement.md).
//!
//! A job runs on a replica of both policies and goes through these phases, each
//! checkpointed in the `_jobs` system table (replicated, durable), so it resumes
//! after a crash of the replica running it:
//!
//! 1. **dual-write**: a `_location` entry marks the prefix as migrating; from then on
//!    every replica routes writes of those rows into both policies' streams (only
//!    replicas of both accept them). The job waits until every replica has applied
//!    the entry.
//! 2. **backfill**: the job copies each existing row's state into the new policy's
//!    stream (`MergeRow`, which keeps every version's own timestamp and origin, so
//!    copying twice or racing a dual write is harmless), checkpointing its position.
//! 3. **flip**: once every replica of the new policy has applied the new scope's
//!    streams as far as the runner has (the backfill and the dual writes it saw: the
//!    flip travels in another stream and could otherwise overtake them), a new
//!    `_location` entry puts the rows in the new policy; the job waits until every
//!    replica has applied it. Replicas outside the new policy then purge
//!    the rows from their stores; reads and writes go to the new policy's replicas.
//! 4. **done**.

use crate::Shared;
use crate::driver::Input;
use bytes::Bytes;
use pangea_core::location::{
    JOBS_COLUMN, JOBS_FAMILY, JOBS_TABLE, LOCATION_COLUMN, LOCATION_FAMILY, LOCATION_TABLE,
    LocationEntry, location_key,
};
use pangea_core::{Error as CoreError, Limits, Mutation, RowMutation, ScopeId, Token};
use pangea_proto::Message;
use pangea_proto::v1 as pb;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// Rows copied per checkpoint.
const BACKFILL_BATCH_ROWS: usize = 100;
/// How often the job checks whether every replica applied an entry.
const POLL: Duration = Duration::from_millis(100);

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

async fn propose(
    shared: &Shared,
    scope: Option<ScopeId>,
    mutation: RowMutation,
) -> Result<Token, CoreError> {
    let (reply, wait) = oneshot::channel();
    let input = match scope {
        Some(scope) => Input::ProposeIn {
            scope,
            mutation,
            reply,
        },
        None => Input::Propose { mutation, reply },
    };
    if shared.driver.send(input).await.is_err() {
        return Err(shutting_down());
    }
    wait.await.map_err(|_| shutting_down())?
}

fn shutting_down() -> CoreError {
    CoreError::Storage(pangea_core::StorageError::Io(
        "replica is shutting down".into(),
    ))
}

fn set(
    table: &str,
    key: impl Into<Bytes>,
    family: &str,
    column: &'static [u8],
    value: Vec<u8>,
) -> Result<RowMutation, CoreError> {
    let m = Mutation::SetCell {
        family: family.into(),
        column: Bytes::from_static(column),
        value: Bytes::from(value),
    };
    RowMutation::new(table, key.into(), vec![m], &Limits::STORED)
}

async fn save(shared: &Shared, job: &mut pb::MigrationJob) -> Result<(), CoreError> {
    job.updated_unix_ms = now_ms();
    propose(
        shared,
        None,
        set(
            JOBS_TABLE,
            job.id.clone().into_bytes(),
            JOBS_FAMILY,
            JOBS_COLUMN,
            job.encode_to_vec(),
        )?,
    )
    .await?;
    Ok(())
}

/// Waits until every replica of `scope` has applied the write `token` names.
async fn applied_everywhere(shared: &Shared, token: &Token) {
    stream_applied_everywhere(shared, &token.scope, &token.origin, token.sequence).await;
}

/// Waits until every replica of `scope` has applied `origin`'s stream up to
/// `sequence`.
async fn stream_applied_everywhere(
    shared: &Shared,
    scope: &ScopeId,
    origin: &pangea_core::ReplicaId,
    sequence: u64,
) {
    loop {
        let (reply, wait) = oneshot::channel();
        let input = Input::AppliedEverywhere {
            scope: scope.clone(),
            origin: origin.clone(),
            sequence,
            reply,
        };
        if shared.driver.send(input).await.is_err() {
            return;
        }
        if wait.await.unwrap_or(false) {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Starts a job moving `table`/`prefix` to `to`, run here. Returns its id.
pub async fn start(
    shared: Arc<Shared>,
    table: String,
    prefix: Bytes,
    to: String,
    home: String,
) -> Result<String, String> {
    let d = shared.deployment();
    if d.placement.schema.table(&table).is_none() || table.starts_with('_') {
        return Err(format!("unknown table {table:?}"));
    }
    let to_scope = ScopeId::from(to.as_str());
    if d.placement.policy(&to_scope).is_none() {
        return Err(format!("unknown placement policy {to:?}"));
    }
    if !home.is_empty()
        && !d
            .placement
            .policy(&to_scope)
            .is_some_and(|p| p.regions.iter().any(|r| r.as_str() == home))
    {
        return Err(format!("home region {home:?} is not in policy {to:?}"));
    }
    if !d
        .topology
        .replicas
        .values()
        .any(|r| r.role.stores_rows() && d.allowed(&r.id, &to_scope))
    {
        return Err(format!(
            "no replica of policy {to:?} stores rows: the move would leave them nowhere"
        ));
    }
    // Residency is the placement file's: a move may narrow where rows live, never
    // widen it (that is an edit of the file, reviewed and applied).
    if let Some(bound) =
        pangea_core::location::escapes_residency(&shared.files(), &table, &prefix, &to_scope)
    {
        return Err(format!(
            "policy {to:?} would put rows of {table:?} under {} in regions outside policy \
             {bound:?}, which the placement file gives them; widen residency by editing \
             the placement file (pangea topology apply), not with a move",
            pangea_core::redact::RedactedKey(&prefix)
        ));
    }
    let from = shared.scope_of(&table, &prefix);
    if from == to_scope {
        return Err(format!(
            "rows of {table:?} under {:?} are already in policy {to:?}",
            String::from_utf8_lossy(&prefix)
        ));
    }
    if !d.allowed(&shared.id, &from) || !d.allowed(&shared.id, &to_scope) {
        return Err(format!(
            "replica {} is not in both policies {from:?} and {to:?}; run the move on a replica of both (or move through \"global\" in two steps)",
            shared.id
        ));
    }
    let id = format!("{table}:{}:{}", hex(&prefix), now_ms());
    let mut job = pb::MigrationJob {
        id: id.clone(),
        table,
        prefix,
        from_policy: from.to_string(),
        to_policy: to,
        home_region: home,
        runner: shared.id.to_string(),
        phase: "planned".into(),
        started_unix_ms: now_ms(),
        ..Default::default()
    };
    save(&shared, &mut job).await.map_err(|e| e.to_string())?;
    tokio::spawn(run(shared, job));
    Ok(id)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// Resumes every unfinished job this replica was running (after a restart).
pub fn resume(shared: Arc<Shared>) {
    let jobs = match shared.scan(JOBS_TABLE, b"", None, usize::MAX) {
        Ok(rows) => rows,
        Err(e) => {
            tracing::error!(error = %e, "cannot read migration jobs");
            return;
        }
    };
    for (key, row) in jobs {
        let Some(job) = pangea_core::location::decode_job(&key, &row) else {
            continue;
        };
        if job.runner == shared.id.as_str() && !matches!(job.phase.as_str(), "done" | "failed") {
            tracing::info!(job = %job.id, phase = %job.phase, rows = job.rows_copied, "resuming migration job");
            tokio::spawn(run(shared.clone(), job));
        }
    }
}

async fn run(shared: Arc<Shared>, mut job: pb::MigrationJob) {
    if let Err(e) = drive(&shared, &mut job).await {
        tracing::error!(job = %job.id, error = %e, "migration job failed");
        job.phase = "failed".into();
        job.error = e.to_string();
        let _ = save(&shared, &mut job).await;
    }
}

async fn write_location(
    shared: &Shared,
    job: &pb::MigrationJob,
    policy: &str,
    migrating_to: &str,
    home: &str,
) -> Result<Token, CoreError> {
    let current = shared.location.read().ok().and_then(|l| {
        l.entries()
            .find(|e| *e.table == *job.table && e.prefix == job.prefix)
            .cloned()
    });
    // A home carried over from the current entry must lie in the new policy.
    let policy_regions = shared
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
    let key = location_key(&job.table, &job.prefix);
    propose(
        shared,
        None,
        set(
            LOCATION_TABLE,
            key,
            LOCATION_FAMILY,
            LOCATION_COLUMN,
            entry.to_proto().encode_to_vec(),
        )?,
    )
    .await
}

async fn drive(shared: &Shared, job: &mut pb::MigrationJob) -> Result<(), CoreError> {
    loop {
        match job.phase.as_str() {
            "planned" => {
                let token = write_location(
                    shared,
                    job,
                    &job.from_policy.clone(),
                    &job.to_policy.clone(),
                    "",
                )
                .await?;
                applied_everywhere(shared, &token).await;
                job.rows_total = count_rows(shared, job).await?;
                job.phase = "backfill".into();
                save(shared, job).await?;
            }
            "backfill" => {
                let to = ScopeId::from(job.to_policy.as_str());
                let after = (!job.backfill_after.is_empty()).then(|| job.backfill_after.clone());
                let rows = shared.scan(
                    &job.table,
                    &job.prefix,
                    after.as_deref(),
                    BACKFILL_BATCH_ROWS,
                )?;
                if rows.is_empty() {
                    job.phase = "flip".into();
                    save(shared, job).await?;
                    continue;
                }
                // The whole batch is handed to the driver at once, so one fsync
                // covers it (group commit), then awaited.
                let mut last = Bytes::new();
                let mut pending = Vec::new();
                for (key, row) in rows {
                    last = key.clone();
                    // A longer prefix with its own entry governs this row, not this job.
                    let governed = shared
                        .location
                        .read()
                        .ok()
                        .and_then(|l| l.lookup(&job.table, &key).map(|e| e.job_id == job.id))
                        .unwrap_or(false);
                    if !governed || row.is_empty() {
                        continue;
                    }
                    let mutation = RowMutation::new(
                        job.table.as_str(),
                        key,
                        vec![Mutation::MergeRow(Box::new(row))],
                        &Limits::STORED,
                    )?;
                    let (reply, wait) = oneshot::channel();
                    if shared
                        .driver
                        .send(Input::ProposeIn {
                            scope: to.clone(),
                            mutation,
                            reply,
                        })
                        .await
                        .is_err()
                    {
                        return Err(shutting_down());
                    }
                    pending.push(wait);
                }
                for wait in pending {
                    wait.await.map_err(|_| shutting_down())??;
                    job.rows_copied += 1;
                }
                job.backfill_after = last;
                save(shared, job).await?;
            }
            "flip" => {
                // The new policy's replicas must hold every copied row before reads
                // go to them: the flip is another stream, which a replica may apply
                // before the backfill. So wait until each of them has applied, in the
                // new scope, every origin's stream as far as this replica has (the
                // backfill and the dual writes it has seen).
                let to = ScopeId::from(job.to_policy.as_str());
                let applied_here: Vec<(pangea_core::ReplicaId, u64)> = shared
                    .watermarks
                    .read()
                    .ok()
                    .and_then(|w| {
                        w.get(&to)
                            .map(|wm| wm.iter().map(|(o, w)| (o.clone(), w.sequence)).collect())
                    })
                    .unwrap_or_default();
                for (origin, sequence) in applied_here {
                    stream_applied_everywhere(shared, &to, &origin, sequence).await;
                }
                let token = write_location(
                    shared,
                    job,
                    &job.to_policy.clone(),
                    "",
                    &job.home_region.clone(),
                )
                .await?;
                applied_everywhere(shared, &token).await;
                job.phase = "done".into();
                save(shared, job).await?;
                tracing::info!(job = %job.id, rows = job.rows_copied, "migration done");
            }
            _ => return Ok(()),
        }
    }
}

/// Rows under the job's prefix, a page at a time, yielding to the runtime between
/// pages (serving and replication share it; see `audit` in `serve`).
async fn count_rows(shared: &Shared, job: &pb::MigrationJob) -> Result<u64, CoreError> {
    let mut n = 0u64;
    let mut after: Option<Bytes> = None;
    loop {
        let rows = shared.scan(&job.table, &job.prefix, after.as_deref(), 10_000)?;
        let Some((last, _)) = rows.last() else {
            return Ok(n);
        };
        after = Some(last.clone());
        n += rows.len() as u64;
        tokio::task::yield_now().await;
    }
}
