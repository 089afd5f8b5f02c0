//! `pangea backup create`: a full backup (every row, and the tail that makes
//! them a cut) or an incremental one (the changes since its parent's cut), each
//! scope read from one replica of it while it serves (module docs of
//! [`crate::backup`]).

use super::{
    FileEntry, FileKind, Kind, MANIFEST, Manifest, Parent, Position, RecordWriter, ScopeBackup,
    cursor_at, file_name,
};
use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use pangea_client::{ChangesFrom, Client, Error as ClientError, ReadFilter, ScanOptions};
use pangea_core::changes::Cursor;
use pangea_core::{ReplicaId, ScopeId, ScopeWatermarks};
use pangea_topology::Deployment;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Rows per scan page, changes per change-stream page.
const PAGE: u32 = 1_000;
/// Replicas tried for one scope before the backup fails.
const ATTEMPTS_MAX: usize = 3;
/// How long the cut waits for the replica's durable watermarks to cover every
/// version its rows showed (a group commit or two, unless its disk stalls).
const CUT_WAIT_MAX: Duration = Duration::from_secs(10);
/// How long a tail read waits for the stream to reach the cut.
const TAIL_WAIT_MAX: Duration = Duration::from_secs(30);

/// What to back up, and where.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// A new or empty directory.
    pub to: PathBuf,
    /// An incremental backup: the changes since this backup's cut.
    pub incremental_from: Option<PathBuf>,
    /// Only these tables (empty: every table of the placement file; an
    /// incremental backup: its parent's).
    pub tables: Vec<String>,
    /// Only scopes of these placement policies (empty: every policy): run the
    /// backup of a restricted policy where its files may be stored.
    pub policies: Vec<String>,
    /// Deadline of each call to a replica.
    pub deadline: Duration,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Writes a backup into `o.to` and returns its manifest (also written there,
/// last). `progress` gets a line now and then.
pub async fn create(
    client: &Client,
    o: &CreateOptions,
    progress: &mut (dyn FnMut(String) + Send),
) -> Result<Manifest> {
    let d = client.deployment();
    let started_ms = now_ms();
    ensure!(
        !o.to.join(MANIFEST).exists(),
        "{} already holds a backup: give a new directory",
        o.to.display()
    );
    std::fs::create_dir_all(&o.to).with_context(|| format!("creating {}", o.to.display()))?;
    let parent = match &o.incremental_from {
        Some(dir) => {
            let dir = std::path::absolute(dir)?;
            let m = Manifest::load(&dir)?;
            Some((dir, m))
        }
        None => None,
    };
    let tables = tables_of(&d, o, parent.as_ref().map(|(_, m)| m))?;
    let mut scopes = scopes_of(&d, o, parent.as_ref().map(|(_, m)| m))?;
    // Residency: a backup is stored where it is made, so a policy's rows are
    // backed up only from a region the policy allows.
    let here = client.region().clone();
    let mut skipped = Vec::new();
    scopes.retain(|s| {
        let allowed = d
            .placement
            .policy(s)
            .is_some_and(|p| p.regions.contains(&here));
        if !allowed {
            skipped.push(format!(
                "{s}: policy {} keeps its rows in {}; back it up from there (--region {} --policies {})",
                s.policy(),
                policy_regions(&d, s).join(", "),
                policy_regions(&d, s).first().map_or("?", |r| r.as_str()),
                s.policy()
            ));
        }
        allowed
    });
    for line in &skipped {
        progress(format!("skipped {line}"));
    }
    ensure!(
        !scopes.is_empty(),
        "nothing to back up from {here}: {}",
        skipped.join("; ")
    );
    let mut tried: BTreeMap<ScopeId, BTreeSet<ReplicaId>> = BTreeMap::new();
    let mut done: Vec<ScopeBackup> = Vec::new();
    let mut todo: Vec<ScopeId> = scopes;
    while !todo.is_empty() {
        // Each scope at the nearest replica not yet tried; one pass per replica.
        let mut by_replica: BTreeMap<ReplicaId, Vec<ScopeId>> = BTreeMap::new();
        for scope in todo.drain(..) {
            let skip = tried.entry(scope.clone()).or_default();
            let Some(r) = candidates(&d, client, &scope)
                .into_iter()
                .find(|r| !skip.contains(r))
            else {
                bail!(
                    "scope {scope}: no replica left to read it from (tried {:?})",
                    skip
                );
            };
            by_replica.entry(r).or_default().push(scope);
        }
        for (r, scopes) in by_replica {
            progress(format!(
                "reading {} from {r}",
                scopes
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            let pass = match &parent {
                None => full_pass(client, &d, &r, &scopes, &tables, o, progress).await,
                Some((_, pm)) => incremental_pass(client, &d, &r, &scopes, &tables, pm, o).await,
            };
            match pass {
                Ok(backups) => done.extend(backups),
                Err(e) if is_retryable(&e) => {
                    progress(format!(
                        "{r} failed ({e:#}); its scopes go to another replica"
                    ));
                    for s in scopes {
                        let t = tried.entry(s.clone()).or_default();
                        t.insert(r.clone());
                        if t.len() >= ATTEMPTS_MAX {
                            return Err(
                                e.context(format!("scope {s}: {ATTEMPTS_MAX} replicas failed"))
                            );
                        }
                        todo.push(s);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
    done.sort_by(|a, b| a.scope.cmp(&b.scope));
    let manifest = Manifest {
        format: super::FORMAT,
        id: format!("{started_ms}-{}", std::process::id()),
        kind: if parent.is_some() {
            Kind::Incremental
        } else {
            Kind::Full
        },
        parent: parent.map(|(dir, m)| Parent { id: m.id, dir }),
        started_ms,
        finished_ms: now_ms(),
        tables,
        skipped,
        scopes: done,
    };
    manifest.store(&o.to)?;
    Ok(manifest)
}

/// A replica that failed or went away: its scopes are read from another.
fn is_retryable(e: &anyhow::Error) -> bool {
    e.downcast_ref::<ClientError>().is_some_and(|e| {
        matches!(
            e,
            ClientError::Unavailable(_)
                | ClientError::DeadlineExceeded { .. }
                | ClientError::Lost { .. }
                | ClientError::TooStale(_)
                | ClientError::CursorExpired(_)
        )
    })
}

fn tables_of(d: &Deployment, o: &CreateOptions, parent: Option<&Manifest>) -> Result<Vec<String>> {
    let all: Vec<String> = match parent {
        Some(m) => m.tables.clone(),
        None => d
            .placement
            .schema
            .tables
            .keys()
            .filter(|t| !t.starts_with('_'))
            .map(|t| t.to_string())
            .collect(),
    };
    for t in &o.tables {
        ensure!(
            all.contains(t),
            "--tables: {t:?} is not a table of {} (tables: {})",
            if parent.is_some() {
                "the parent backup"
            } else {
                "the placement file"
            },
            all.join(", ")
        );
    }
    Ok(all
        .into_iter()
        .filter(|t| o.tables.is_empty() || o.tables.contains(t))
        .collect())
}

fn scopes_of(d: &Deployment, o: &CreateOptions, parent: Option<&Manifest>) -> Result<Vec<ScopeId>> {
    for p in &o.policies {
        ensure!(
            d.placement.policies.contains_key(p.as_str()),
            "--policies: {p:?} is not a placement policy (policies: {})",
            d.policies()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let wanted = |s: &ScopeId| o.policies.is_empty() || o.policies.iter().any(|p| p == s.policy());
    match parent {
        None => Ok(d.scopes().filter(|s| wanted(s)).cloned().collect()),
        Some(m) => {
            let now: BTreeSet<&ScopeId> = d.scopes().collect();
            let mut scopes = Vec::new();
            for s in &m.scopes {
                let id = ScopeId::new(s.scope.as_str());
                ensure!(
                    now.contains(&id),
                    "the parent backup has scope {id}, which the deployment no longer has \
                     (resized or re-placed): take a full backup"
                );
                if wanted(&id) {
                    scopes.push(id);
                }
            }
            Ok(scopes)
        }
    }
}

/// Replicas that store and serve `scope`'s rows and the client's app profile
/// may use, the client's region first, then by round trip from it.
pub(crate) fn candidates(d: &Deployment, client: &Client, scope: &ScopeId) -> Vec<ReplicaId> {
    d.scope_sources(scope, client.region(), client.app_profile())
}

fn watermarks_of<'a>(
    wms: &'a [ScopeWatermarks],
    scope: &ScopeId,
    r: &ReplicaId,
) -> Result<&'a ScopeWatermarks> {
    wms.iter().find(|w| &w.scope == scope).with_context(|| {
        format!("replica {r} reported no watermarks of scope {scope}: may the app profile read it?")
    })
}

fn rel(scope: &ScopeId, table: &str, kind: FileKind) -> String {
    let ext = match kind {
        FileKind::Rows => "rows",
        FileKind::Changes => "changes",
    };
    format!(
        "{}/{}/{}.{ext}",
        file_name(scope.policy()),
        file_name(scope.as_str()),
        file_name(table)
    )
}

fn policy_regions(d: &Deployment, scope: &ScopeId) -> Vec<String> {
    d.placement
        .policy(scope)
        .map(|p| p.regions.iter().map(|r| r.to_string()).collect())
        .unwrap_or_default()
}

/// Every row of `tables` in `scopes` from `r`, then the cut and the tail.
async fn full_pass(
    client: &Client,
    d: &Deployment,
    r: &ReplicaId,
    scopes: &[ScopeId],
    tables: &[String],
    o: &CreateOptions,
    progress: &mut (dyn FnMut(String) + Send),
) -> Result<Vec<ScopeBackup>> {
    let start = client.watermarks(r).await?;
    for s in scopes {
        watermarks_of(&start, s, r)?;
    }
    let location = client.location();
    let mut files: BTreeMap<&ScopeId, Vec<FileEntry>> = BTreeMap::new();
    // The newest version seen per (scope, origin): the cut must cover it.
    let mut newest: BTreeMap<(ScopeId, String), u64> = BTreeMap::new();
    let began = Instant::now();
    for table in tables {
        let mut writers: BTreeMap<&ScopeId, RecordWriter> = BTreeMap::new();
        for s in scopes {
            writers.insert(
                s,
                RecordWriter::create(&o.to, &rel(s, table, FileKind::Rows))?,
            );
        }
        let mut scan = ScanOptions {
            limit: PAGE,
            ..Default::default()
        };
        let mut rows = 0u64;
        loop {
            let page = client
                .scan_at(
                    r,
                    table,
                    Bytes::new(),
                    &scan,
                    &ReadFilter::everything(),
                    o.deadline,
                )
                .await?;
            for row in &page.rows {
                let scope = location.scope_of(d, table, &row.key);
                let Some(w) = writers.get_mut(&scope) else {
                    continue; // another scope's, read from its own replica
                };
                for cell in row.families.iter().flat_map(|f| &f.cells) {
                    let n = newest
                        .entry((scope.clone(), cell.origin.clone()))
                        .or_default();
                    *n = (*n).max(cell.timestamp);
                }
                w.push(row)?;
                rows += 1;
            }
            if rows / 50_000 != (rows - page.rows.len().min(rows as usize) as u64) / 50_000 {
                progress(format!(
                    "{r}: {table}: {rows} rows ({:.0} s)",
                    began.elapsed().as_secs_f64()
                ));
            }
            if page.resume_key.is_empty() {
                break;
            }
            scan.resume_after = page.resume_key;
        }
        for (s, w) in writers {
            files
                .entry(s)
                .or_default()
                .push(w.finish(table, FileKind::Rows)?);
        }
        progress(format!("{r}: {table}: {rows} rows"));
    }
    let end = cut(client, r, scopes, &newest).await?;
    // The tails: each table's writes of start..end.
    let start_at: Vec<(String, Vec<Position>)> = start
        .iter()
        .map(|w| (w.scope.to_string(), Position::of(w)))
        .collect();
    let mut notes: BTreeMap<&ScopeId, Vec<String>> = BTreeMap::new();
    for table in tables {
        let has_stream = d
            .placement
            .schema
            .table(table)
            .is_some_and(|t| t.change_retention_ms.is_some());
        if !has_stream {
            for s in scopes {
                notes.entry(s).or_default().push(format!(
                    "table {table} has no change stream: each of its rows is as of a moment \
                     between start and end"
                ));
            }
            continue;
        }
        let from = cursor_at(start_at.iter().map(|(s, p)| (s.as_str(), p.as_slice())));
        match tail(client, r, table, scopes, from, &end, o).await {
            Ok(by_scope) => {
                for (s, entry) in by_scope {
                    files.entry(s).or_default().push(entry);
                }
            }
            Err(e)
                if matches!(
                    e.downcast_ref::<ClientError>(),
                    Some(ClientError::CursorExpired(_))
                ) =>
            {
                for s in scopes {
                    notes.entry(s).or_default().push(format!(
                        "table {table}: {r}'s log no longer held the tail ({e:#}); its rows \
                         are each as of a moment between start and end (a longer \
                         changes.retention keeps it)"
                    ));
                }
            }
            Err(e) => return Err(e),
        }
    }
    let mut out = Vec::new();
    for s in scopes {
        let note = notes.remove(s).map(|n| n.join("; "));
        out.push(ScopeBackup {
            scope: s.to_string(),
            policy: s.policy().to_owned(),
            regions: policy_regions(d, s),
            replica: r.to_string(),
            start: Position::of(watermarks_of(&start, s, r)?),
            end: Position::of(watermarks_of(&end, s, r)?),
            exact: note.is_none(),
            note,
            files: files.remove(s).unwrap_or_default(),
        });
    }
    Ok(out)
}

/// The replica's watermarks once they cover `newest` (and a moment after the
/// rows were read): every write a row showed is at or below them.
async fn cut(
    client: &Client,
    r: &ReplicaId,
    scopes: &[ScopeId],
    newest: &BTreeMap<(ScopeId, String), u64>,
) -> Result<Vec<ScopeWatermarks>> {
    let began = Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    loop {
        let wms = client.watermarks(r).await?;
        let covered = newest.iter().all(|((s, origin), ts)| {
            wms.iter()
                .find(|w| &w.scope == s)
                .is_some_and(|w| w.get(&ReplicaId::new(origin.as_str())).timestamp.as_u64() >= *ts)
        });
        if covered && scopes.iter().all(|s| wms.iter().any(|w| &w.scope == s)) {
            return Ok(wms);
        }
        ensure!(
            began.elapsed() < CUT_WAIT_MAX,
            "replica {r}'s durable watermarks did not reach the versions its rows showed \
             within {CUT_WAIT_MAX:?} (is its disk stalled?)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `table`'s changes in `scopes` from `from` up to `end`, read from `r`, one
/// file per scope.
async fn tail<'s>(
    client: &Client,
    r: &ReplicaId,
    table: &str,
    scopes: &'s [ScopeId],
    mut from: Cursor,
    end: &[ScopeWatermarks],
    o: &CreateOptions,
) -> Result<Vec<(&'s ScopeId, FileEntry)>> {
    let mut writers: BTreeMap<&ScopeId, RecordWriter> = BTreeMap::new();
    for s in scopes {
        writers.insert(
            s,
            RecordWriter::create(&o.to, &rel(s, table, FileKind::Changes))?,
        );
    }
    let last = |s: &ScopeId, origin: &ReplicaId| {
        end.iter()
            .find(|w| &w.scope == s)
            .map_or(0, |w| w.get(origin).sequence)
    };
    let began = Instant::now();
    loop {
        let page = client
            .read_changes_at(
                r,
                "",
                table,
                Bytes::new(),
                &ChangesFrom::Cursor(from.encode()),
                PAGE,
                o.deadline,
            )
            .await?;
        for c in &page.changes {
            if let Some(w) = writers.get_mut(&c.scope)
                && c.sequence <= last(&c.scope, &c.origin)
            {
                w.push(&c.to_proto())?;
            }
        }
        from = Cursor::decode(&page.cursor).map_err(anyhow::Error::msg)?;
        let reached = scopes.iter().all(|s| {
            end.iter().find(|w| &w.scope == s).is_some_and(|w| {
                w.iter()
                    .all(|(origin, m)| from.position(s, origin) >= m.sequence)
            })
        });
        if reached {
            break;
        }
        if !page.more {
            ensure!(
                began.elapsed() < TAIL_WAIT_MAX,
                "replica {r}'s change stream of {table} did not reach the cut within \
                 {TAIL_WAIT_MAX:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    writers
        .into_iter()
        .map(|(s, w)| Ok((s, w.finish(table, FileKind::Changes)?)))
        .collect()
}

/// The changes of `tables` in `scopes` since the parent's cut, read from `r`.
async fn incremental_pass(
    client: &Client,
    d: &Deployment,
    r: &ReplicaId,
    scopes: &[ScopeId],
    tables: &[String],
    parent: &Manifest,
    o: &CreateOptions,
) -> Result<Vec<ScopeBackup>> {
    for table in tables {
        ensure!(
            d.placement
                .schema
                .table(table)
                .is_some_and(|t| t.change_retention_ms.is_some()),
            "table {table} has no change stream, so an incremental backup cannot follow it: \
             give it `changes = {{ retention = \"…\" }}` longer than the time between backups, \
             or take a full backup (--tables leaves tables out)"
        );
    }
    let end = client.watermarks(r).await?;
    let starts: BTreeMap<&str, &ScopeBackup> = parent
        .scopes
        .iter()
        .map(|s| (s.scope.as_str(), s))
        .collect();
    // The cursor: the parent's cut for these scopes, now for the others (so
    // that their streams are passed over, not read from their start).
    let positions: Vec<(String, Vec<Position>)> = end
        .iter()
        .map(|w| match starts.get(w.scope.as_str()) {
            Some(p) if scopes.contains(&w.scope) => (w.scope.to_string(), p.end.clone()),
            _ => (w.scope.to_string(), Position::of(w)),
        })
        .collect();
    let mut files: BTreeMap<&ScopeId, Vec<FileEntry>> = BTreeMap::new();
    for table in tables {
        let from = cursor_at(positions.iter().map(|(s, p)| (s.as_str(), p.as_slice())));
        let by_scope = tail(client, r, table, scopes, from, &end, o)
            .await
            .map_err(|e| match e.downcast_ref::<ClientError>() {
                Some(ClientError::CursorExpired(_)) => e.context(format!(
                    "{r}'s log no longer holds the changes since the parent backup's cut \
                     (changes.retention of {table} passed): take a full backup"
                )),
                _ => e,
            })?;
        for (s, entry) in by_scope {
            files.entry(s).or_default().push(entry);
        }
    }
    let mut out = Vec::new();
    for s in scopes {
        let p = starts
            .get(s.as_str())
            .with_context(|| format!("the parent backup has no scope {s}"))?;
        out.push(ScopeBackup {
            scope: s.to_string(),
            policy: s.policy().to_owned(),
            regions: policy_regions(d, s),
            replica: r.to_string(),
            start: p.end.clone(),
            end: Position::of(watermarks_of(&end, s, r)?),
            exact: p.exact,
            note: p.note.clone(),
            files: files.remove(s).unwrap_or_default(),
        });
    }
    Ok(out)
}
