//! The checker workloads of a nemesis run, each through `pangea-client` with one
//! client per region, every operation recorded in the history:
//!
//! Keys live under a tag of the run (`reg/TAG/...`), so runs on one cluster do not
//! see each other's keys.
//!
//! - `register`: a few hot keys (`reg/TAG/0`..`4`) overwritten from every region; in
//!   every region a reader reads a key at the latest token acknowledged for it
//!   (watermark consistency), wherever that write landed.
//! - `ryw`: read-your-writes across regions: write a fresh key (`ryw/...`) in one
//!   region, then read it in the next region at the write's token.
//! - `set`: unique inserts (`set/...`), and one in four under `eu/set/...`, a prefix
//!   the placement keeps in eu-west-1 (its residency is audited at the end).
//! - `changes`: in every region a consumer of the table's change stream, from
//!   its cursor at the start, through every fault, and read to its end after the
//!   cluster converged: every acknowledged write must be in some consumer's
//!   stream (C9).
//! - `backup`: a full backup (`pangea_ops::backup::create`) from the first region
//!   every few seconds, through every fault; after the heal each is read back as
//!   of its cut: it holds every acknowledged write at or below its cut, and no
//!   unique-key write above it (C10).
//!
//! After the heal, [`settle`] waits for convergence, audits every replica and reads
//! what each one holds under every workload prefix.

use super::history::hex;
use super::history::{Cell, Event, Kind, Op, Outcome, Recorder, ScopeDigest, Version};
use anyhow::{Context, Result};
use bytes::Bytes;
use pangea_client::{
    ChangesFrom, Client, ClientConfig, Consistency, Mutation, ReadOptions, Row, RowMutation,
    ScanOptions, Token, WriteOptions,
};
use pangea_topology::cluster::ClusterFile;
use pangea_topology::{Deployment, ReplicaId, process_id};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

pub const WORKLOADS: [&str; 5] = ["register", "ryw", "set", "changes", "backup"];

const TABLE: &str = "ad_profiles";
const FAMILY: &str = "profile";
const COLUMN: &[u8] = b"v";
const HOT_KEYS: u64 = 5;
/// Pause between one worker's operations: ~30 operations per second per worker keep
/// a 2-core machine responsive while faults are injected.
const PACE: Duration = Duration::from_millis(30);
const WRITE_DEADLINE: Duration = Duration::from_secs(2);
const READ_DEADLINE: Duration = Duration::from_secs(1);
/// Prefixes the final state is read under (each followed by the run's tag, so runs
/// on one cluster do not see each other's keys).
const PREFIXES: [&str; 4] = ["reg/", "ryw/", "set/", "eu/set/"];

/// The running workloads.
pub(super) struct Load {
    stop: Arc<AtomicBool>,
    tasks: JoinSet<()>,
    consumers: Arc<Mutex<Vec<Consumer>>>,
    backups: Arc<Mutex<Vec<(u64, PathBuf)>>>,
    backup_dir: tempfile::TempDir,
}

/// What the workloads leave to be read after the heal: the change-stream
/// consumers where they stopped, the backups taken.
pub(super) struct Leftover {
    consumers: Vec<Consumer>,
    backups: Vec<(u64, PathBuf)>,
    _backup_dir: tempfile::TempDir,
}

/// A change-stream consumer where it stopped: read to the end after the heal.
struct Consumer {
    region: String,
    client: Arc<Client>,
    cursor: Option<Bytes>,
}

impl Load {
    /// Stops every worker after its current operation (each is bounded by its
    /// deadline) and waits for them; the change-stream consumers, to be read to
    /// their end once the cluster converged ([`drain_changes`]).
    pub(super) async fn stop(mut self) -> Leftover {
        self.stop.store(true, Ordering::Relaxed);
        while self.tasks.join_next().await.is_some() {}
        let take =
            |m: &Mutex<Vec<_>>| std::mem::take(&mut *m.lock().unwrap_or_else(|e| e.into_inner()));
        Leftover {
            consumers: take(&self.consumers),
            backups: std::mem::take(&mut *self.backups.lock().unwrap_or_else(|e| e.into_inner())),
            _backup_dir: self.backup_dir,
        }
    }
}

impl Leftover {
    /// After convergence: reads the change streams to their end and each
    /// backup back as of its cut.
    pub(super) async fn finish(
        self,
        deployment: &Deployment,
        rec: &Recorder,
        limit: Duration,
        tag: &str,
    ) {
        drain_changes(self.consumers, rec, limit).await;
        read_backups(&self.backups, deployment, rec, tag);
    }
}

struct Ctx {
    rec: Arc<Recorder>,
    /// This run's key namespace.
    tag: String,
    stop: Arc<AtomicBool>,
    /// Latest acknowledged token per register key.
    latest: Mutex<HashMap<String, Token>>,
}

pub(super) async fn start(
    cluster: &ClusterFile,
    deployment: &Deployment,
    workloads: &[String],
    rec: Arc<Recorder>,
    seed: u64,
    tag: &str,
) -> Result<Load> {
    let mut clients = Vec::new();
    for region in deployment.topology.regions.keys() {
        let config = ClientConfig::from_cluster(cluster, region.as_str(), "frontend")?;
        let client = Client::connect(config)
            .await
            .with_context(|| format!("connecting a client in {region}"))?;
        clients.push((region.to_string(), Arc::new(client)));
    }
    let ctx = Arc::new(Ctx {
        rec,
        tag: tag.to_owned(),
        stop: Arc::new(AtomicBool::new(false)),
        latest: Mutex::new(HashMap::new()),
    });
    let mut tasks = JoinSet::new();
    let consumers = Arc::new(Mutex::new(Vec::new()));
    let backups = Arc::new(Mutex::new(Vec::new()));
    let backup_dir = tempfile::Builder::new()
        .prefix("pangea-nemesis-backups-")
        .tempdir()?;
    for (i, (region, client)) in clients.iter().enumerate() {
        let next = clients[(i + 1) % clients.len()].1.clone();
        for w in workloads {
            let (ctx, region, client) = (ctx.clone(), region.clone(), client.clone());
            let seed = seed ^ ((i as u64) << 32);
            match w.as_str() {
                "register" => {
                    let (c2, r2, cl2) = (ctx.clone(), region.clone(), client.clone());
                    tasks.spawn(register_writer(c2, r2, cl2, seed));
                    tasks.spawn(register_reader(ctx, region, client, seed ^ 1));
                }
                "ryw" => {
                    tasks.spawn(ryw(ctx, region, client, next.clone()));
                }
                "set" => {
                    tasks.spawn(set(ctx, region, client));
                }
                "changes" => {
                    tasks.spawn(consume_changes(ctx, region, client, consumers.clone()));
                }
                "backup" if i == 0 => {
                    let dir = backup_dir.path().to_owned();
                    tasks.spawn(take_backups(ctx, region, client, dir, backups.clone()));
                }
                _ => {}
            }
        }
    }
    Ok(Load {
        stop: ctx.stop.clone(),
        tasks,
        consumers,
        backups,
        backup_dir,
    })
}

fn value_cell(row: &Row) -> Option<(String, Version)> {
    let cell = row
        .families
        .iter()
        .find(|f| f.name == FAMILY)?
        .cells
        .iter()
        .find(|c| c.column.as_ref() == COLUMN)?;
    Some((
        String::from_utf8_lossy(&cell.value).into_owned(),
        Version {
            ts: cell.timestamp,
            origin: cell.origin.clone(),
        },
    ))
}

/// Writes `key = value`, records it; the token if acknowledged.
async fn write(
    ctx: &Ctx,
    workload: &str,
    region: &str,
    client: &Client,
    key: &str,
    value: &str,
) -> Option<Token> {
    let id = ctx.rec.next_id();
    let start_us = ctx.rec.now_us();
    let m = RowMutation::new(
        TABLE,
        Bytes::copy_from_slice(key.as_bytes()),
        vec![Mutation::SetCell {
            family: FAMILY.into(),
            column: Bytes::from_static(COLUMN),
            value: Bytes::copy_from_slice(value.as_bytes()),
        }],
        &pangea_core::Limits::default(),
    );
    let result = match m {
        Ok(m) => {
            client
                .mutate(
                    m,
                    &WriteOptions {
                        deadline: Some(WRITE_DEADLINE),
                        ..Default::default()
                    },
                )
                .await
        }
        Err(e) => Err(pangea_client::Error::InvalidInput(e.to_string())),
    };
    let mut op = Op::begun(id, workload, region, Kind::Write, key, start_us);
    op.value = Some(value.into());
    op.end_us = ctx.rec.now_us();
    let token = match result {
        Ok(r) => {
            op.token = Some(hex(&r.value.encode()));
            op.version = Some(Version {
                ts: r.value.timestamp.as_u64(),
                origin: r.value.origin.to_string(),
            });
            op.replica = Some(r.replica.to_string());
            Some(r.value)
        }
        Err(e) => {
            use pangea_client::Error as E;
            // Refused before anything was written; anything else may have applied.
            op.outcome = match e {
                E::PolicyForbids(_) | E::InvalidInput(_) | E::NotFound(_) => Outcome::Fail,
                _ => Outcome::Info,
            };
            op.error = Some(e.to_string());
            None
        }
    };
    ctx.rec.record(Event::Op(op));
    token
}

/// Reads `key` at `token` (watermark consistency) and records what came back.
async fn read_at(ctx: &Ctx, workload: &str, region: &str, client: &Client, key: &str, t: Token) {
    let id = ctx.rec.next_id();
    let start_us = ctx.rec.now_us();
    let token = hex(&t.encode());
    let opts = ReadOptions::default()
        .with_consistency(Consistency::Watermark(t))
        .with_deadline(READ_DEADLINE);
    let result = client
        .get(TABLE, Bytes::copy_from_slice(key.as_bytes()), &opts)
        .await;
    let mut op = Op::begun(id, workload, region, Kind::Read, key, start_us);
    op.consistency = Some("watermark".into());
    op.token = Some(token);
    op.end_us = ctx.rec.now_us();
    match result {
        Ok(r) => {
            op.replica = Some(r.replica.to_string());
            if let Some((value, version)) = r.value.as_ref().and_then(value_cell) {
                op.value = Some(value);
                op.version = Some(version);
            }
        }
        Err(e) => {
            op.outcome = Outcome::Fail;
            op.error = Some(e.to_string());
        }
    }
    ctx.rec.record(Event::Op(op));
}

async fn register_writer(ctx: Arc<Ctx>, region: String, client: Arc<Client>, seed: u64) {
    let mut rng = pangea_core::rng::Rng::new(seed);
    let mut n = 0u64;
    while !ctx.stop.load(Ordering::Relaxed) {
        n += 1;
        let key = format!("reg/{}/{}", ctx.tag, rng.next_u64() % HOT_KEYS);
        let value = format!("{region}-{n}");
        if let Some(t) = write(&ctx, "register", &region, &client, &key, &value).await {
            let mut latest = ctx.latest.lock().unwrap_or_else(|e| e.into_inner());
            latest.insert(key, t);
        }
        tokio::time::sleep(PACE).await;
    }
}

async fn register_reader(ctx: Arc<Ctx>, region: String, client: Arc<Client>, seed: u64) {
    let mut rng = pangea_core::rng::Rng::new(seed);
    while !ctx.stop.load(Ordering::Relaxed) {
        let key = format!("reg/{}/{}", ctx.tag, rng.next_u64() % HOT_KEYS);
        let token = ctx
            .latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        if let Some(t) = token {
            read_at(&ctx, "register", &region, &client, &key, t).await;
        }
        tokio::time::sleep(PACE).await;
    }
}

async fn ryw(ctx: Arc<Ctx>, region: String, client: Arc<Client>, next: Arc<Client>) {
    let mut n = 0u64;
    while !ctx.stop.load(Ordering::Relaxed) {
        n += 1;
        let key = format!("ryw/{}/{region}/{n}", ctx.tag);
        let value = format!("{region}-{n}");
        if let Some(t) = write(&ctx, "ryw", &region, &client, &key, &value).await {
            let there = next.region().to_string();
            read_at(&ctx, "ryw", &there, &next, &key, t).await;
        }
        tokio::time::sleep(PACE).await;
    }
}

async fn set(ctx: Arc<Ctx>, region: String, client: Arc<Client>) {
    let mut n = 0u64;
    while !ctx.stop.load(Ordering::Relaxed) {
        n += 1;
        let key = if n.is_multiple_of(4) {
            format!("eu/set/{}/{region}/{n}", ctx.tag)
        } else {
            format!("set/{}/{region}/{n}", ctx.tag)
        };
        write(
            &ctx,
            "set",
            &region,
            &client,
            &key,
            &format!("{region}-{n}"),
        )
        .await;
        tokio::time::sleep(PACE).await;
    }
}

const CHANGES_PAGE: u32 = 500;
/// How long a consumer whose cursor expired at every replica keeps trying.
const CHANGES_EXPIRED_MAX: Duration = Duration::from_secs(10);

/// One page of the table's change stream from `cursor` (`None`: from now).
async fn changes_page(
    client: &Client,
    cursor: Option<&Bytes>,
) -> Result<pangea_client::ChangesPage, pangea_client::Error> {
    let from = match cursor {
        Some(c) => ChangesFrom::Cursor(c.clone()),
        None => ChangesFrom::Now,
    };
    let opts = ReadOptions::default().with_deadline(READ_DEADLINE);
    Ok(client
        .read_changes(TABLE, Bytes::new(), &from, CHANGES_PAGE, &opts)
        .await?
        .value)
}

/// Records a page's changes, if any.
fn record_changes(rec: &Recorder, region: &str, page: &pangea_client::ChangesPage) {
    if page.changes.is_empty() {
        return;
    }
    rec.record(Event::Changes {
        region: region.to_owned(),
        at_us: rec.now_us(),
        names: page
            .changes
            .iter()
            .map(|c| (c.scope.to_string(), c.origin.to_string(), c.sequence))
            .collect(),
    });
}

/// A consumer of the table's change stream in `region`, from now until the
/// workloads stop; it leaves its cursor in `consumers`.
async fn consume_changes(
    ctx: Arc<Ctx>,
    region: String,
    client: Arc<Client>,
    consumers: Arc<Mutex<Vec<Consumer>>>,
) {
    let mut cursor: Option<Bytes> = None;
    let mut expired_since: Option<Instant> = None;
    while !ctx.stop.load(Ordering::Relaxed) {
        match changes_page(&client, cursor.as_ref()).await {
            Ok(page) => {
                expired_since = None;
                if cursor.is_none() {
                    ctx.rec.record(Event::ChangesFrom {
                        region: region.clone(),
                        at_us: ctx.rec.now_us(),
                    });
                }
                record_changes(&ctx.rec, &region, &page);
                cursor = Some(page.cursor);
                if page.more {
                    continue;
                }
            }
            Err(pangea_client::Error::CursorExpired(e)) => {
                let since = *expired_since.get_or_insert_with(Instant::now);
                if since.elapsed() > CHANGES_EXPIRED_MAX {
                    ctx.rec.record(Event::ChangesLost {
                        region: region.clone(),
                        at_us: ctx.rec.now_us(),
                        error: e,
                    });
                    return;
                }
            }
            // A fault: ask again (another replica, or the same once back).
            Err(_) => {}
        }
        tokio::time::sleep(PACE).await;
    }
    consumers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Consumer {
            region,
            client,
            cursor,
        });
}

/// After convergence: reads every consumer's stream to its end (until a page
/// comes back empty and caught up twice, 200 ms apart, or `limit` passes).
async fn drain_changes(consumers: Vec<Consumer>, rec: &Recorder, limit: Duration) {
    let until = Instant::now() + limit;
    for mut c in consumers {
        let Some(mut cursor) = c.cursor.take() else {
            continue;
        };
        let mut quiet = 0;
        while quiet < 2 && Instant::now() < until {
            match changes_page(&c.client, Some(&cursor)).await {
                Ok(page) => {
                    quiet = if page.changes.is_empty() && !page.more {
                        quiet + 1
                    } else {
                        0
                    };
                    record_changes(rec, &c.region, &page);
                    cursor = page.cursor;
                    if page.more {
                        continue;
                    }
                }
                Err(e) => rec.say(&format!("change stream in {}: {e}", c.region)),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Time between backups of the `backup` workload.
const BACKUP_EVERY: Duration = Duration::from_secs(3);

/// Full backups from `region` every [`BACKUP_EVERY`] until the workloads stop.
async fn take_backups(
    ctx: Arc<Ctx>,
    region: String,
    client: Arc<Client>,
    dir: PathBuf,
    taken: Arc<Mutex<Vec<(u64, PathBuf)>>>,
) {
    let mut next = Instant::now() + Duration::from_secs(1);
    while !ctx.stop.load(Ordering::Relaxed) {
        if Instant::now() < next {
            tokio::time::sleep(PACE).await;
            continue;
        }
        next = Instant::now() + BACKUP_EVERY;
        let id = ctx.rec.next_id();
        let to = dir.join(id.to_string());
        let start_us = ctx.rec.now_us();
        let o = crate::backup::CreateOptions {
            to: to.clone(),
            incremental_from: None,
            tables: vec![TABLE.to_owned()],
            policies: Vec::new(),
            deadline: Duration::from_secs(5),
        };
        let mut failovers = 0;
        let result = crate::backup::create(&client, &o, &mut |line: String| {
            if line.contains("go to another replica") {
                failovers += 1;
            }
        })
        .await;
        let positions = |m: &crate::backup::Manifest, exact_only: bool| {
            m.scopes
                .iter()
                .flat_map(|s| {
                    let at = if s.exact || !exact_only {
                        &s.end
                    } else {
                        &s.start
                    };
                    at.iter()
                        .map(|p| (s.scope.clone(), p.origin.clone(), p.sequence))
                })
                .collect()
        };
        let (ok, error, cut, held) = match &result {
            Ok(m) => (true, None, positions(m, false), positions(m, true)),
            Err(e) => (false, Some(format!("{e:#}")), Vec::new(), Vec::new()),
        };
        ctx.rec.record(Event::Backup {
            id,
            region: region.clone(),
            start_us,
            end_us: ctx.rec.now_us(),
            ok,
            error,
            failovers,
            cut,
            held,
        });
        if ok {
            taken
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((id, to));
        }
    }
}

/// Each backup's rows under the run's keys, as of its cut.
fn read_backups(taken: &[(u64, PathBuf)], deployment: &Deployment, rec: &Recorder, tag: &str) {
    let schema = deployment.placement.schema.table(TABLE);
    for (id, dir) in taken {
        let rows = match crate::backup::rows_at_cut(dir, TABLE, b"", schema) {
            Ok(rows) => rows,
            Err(e) => {
                rec.say(&format!("backup {id}: {e:#}"));
                rec.record(Event::Backup {
                    id: *id,
                    region: String::new(),
                    start_us: rec.now_us(),
                    end_us: rec.now_us(),
                    ok: false,
                    error: Some(format!("reading it back: {e:#}")),
                    failovers: 0,
                    cut: Vec::new(),
                    held: Vec::new(),
                });
                continue;
            }
        };
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let cells = rows
            .iter()
            .filter(|(key, _)| key.windows(tag.len()).any(|w| w == tag.as_bytes()))
            .filter_map(|(key, st)| {
                let row = st.read(key, &pangea_core::ReadFilter::default(), schema, now_ms)?;
                let (value, version) = value_cell(&row)?;
                Some(Cell {
                    key: String::from_utf8_lossy(key).into_owned(),
                    value,
                    version,
                })
            })
            .collect();
        rec.record(Event::BackupRows {
            id: *id,
            rows: cells,
        });
    }
}

/// After the heal: waits until every replica's digest of each scope agrees (at most
/// `limit`), records it, records every replica's audit, then what each replica holds
/// under the workload prefixes its placement allows.
pub(super) async fn settle(
    cluster: &ClusterFile,
    deployment: &Deployment,
    rec: &Recorder,
    limit: Duration,
    tag: &str,
) -> Result<()> {
    // Audits are operator requests (the cluster's operator certificate); a scan
    // must use a profile allowed on the replica it reads (a batch replica only
    // serves batch).
    let mut clients: BTreeMap<ReplicaId, Arc<Client>> = BTreeMap::new();
    let mut by_profile: BTreeMap<String, Arc<Client>> = BTreeMap::new();
    for r in deployment.topology.replicas.values() {
        let profile = deployment
            .topology
            .app_profiles
            .values()
            .find(|p| p.may_use(r))
            .with_context(|| format!("no app profile may read replica {}", r.id))?;
        let client = match by_profile.get(&profile.name) {
            Some(c) => c.clone(),
            None => {
                let config = ClientConfig::from_cluster(cluster, r.region.as_str(), &profile.name)?;
                let c = Arc::new(Client::connect(config).await?);
                by_profile.insert(profile.name.clone(), c.clone());
                c
            }
        };
        clients.insert(r.id.clone(), client);
    }
    let ids: Vec<ReplicaId> = clients.keys().cloned().collect();
    let first = deployment
        .topology
        .replicas
        .values()
        .next()
        .context("the topology has no replica")?;
    let profile = deployment
        .topology
        .app_profiles
        .values()
        .find(|p| p.may_use(first))
        .context("no app profile may use the first replica")?;
    let config = ClientConfig::from_cluster(cluster, first.region.as_str(), &profile.name)?
        .with_credential(pangea_client::Credential::Operator(
            crate::local::CLUSTER_OPERATOR.into(),
        ));
    let client = Client::connect(config).await?;
    let healed = Instant::now();
    let (ok, detail, audits) = loop {
        let mut audits = Vec::new();
        let mut failed = None;
        for id in &ids {
            match client.audit(id).await {
                Ok(a) => audits.push(a),
                Err(e) => failed = Some(format!("{id}: audit failed: {e}")),
            }
        }
        let disagreement = failed.or_else(|| disagreement(&audits));
        match disagreement {
            None => break (true, String::new(), audits),
            Some(d) if healed.elapsed() >= limit => break (false, d, audits),
            Some(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    };
    let after_heal_ms = healed.elapsed().as_millis() as u64;
    rec.say(&format!(
        "{} {after_heal_ms} ms after the heal{}",
        if ok { "converged" } else { "NOT converged" },
        if ok {
            String::new()
        } else {
            format!(": {detail}")
        }
    ));
    rec.record(Event::Converged {
        ok,
        after_heal_ms,
        detail,
    });
    for a in &audits {
        rec.record(Event::Audit {
            replica: a.replica.clone(),
            region: a.region.clone(),
            rows_disallowed: a.tables.iter().map(|t| t.rows_disallowed).sum(),
            scopes: a
                .scopes
                .iter()
                .map(|s| ScopeDigest {
                    scope: s.scope.clone(),
                    rows: s.rows,
                    digest: hex(&s.digest),
                })
                .collect(),
        });
    }
    // What each replica holds, all its processes together: a process holds the
    // rows of its shard groups; of a row on several (group 0 of `global`, on
    // every process), the oldest copy is the one checked.
    for r in deployment
        .topology
        .replicas
        .values()
        .filter(|r| r.index == 0)
    {
        for prefix in PREFIXES {
            let prefix = format!("{prefix}{tag}/");
            let scope = deployment.scope_of(TABLE, prefix.as_bytes());
            let in_policy = deployment
                .placement
                .policy(scope)
                .is_some_and(|p| p.regions.contains(&r.region));
            if !in_policy {
                continue;
            }
            let mut held: BTreeMap<String, Cell> = BTreeMap::new();
            for index in 0..r.process_count() {
                let id = process_id(r.id.as_str(), index);
                for cell in scan_all(&clients[&id], &id, &prefix).await? {
                    match held.get(&cell.key) {
                        Some(kept) if kept.version <= cell.version => {}
                        _ => {
                            held.insert(cell.key.clone(), cell);
                        }
                    }
                }
            }
            rec.record(Event::Final {
                replica: r.id.to_string(),
                prefix,
                rows: held.into_values().collect(),
            });
        }
    }
    Ok(())
}

/// Why the audits do not agree yet (a scope with two digests), if they do not.
fn disagreement(audits: &[pangea_proto::v1::AuditResponse]) -> Option<String> {
    let mut by_scope: BTreeMap<&str, BTreeMap<&[u8], Vec<&str>>> = BTreeMap::new();
    for a in audits {
        for s in &a.scopes {
            by_scope
                .entry(&s.scope)
                .or_default()
                .entry(&s.digest)
                .or_default()
                .push(&a.replica);
        }
    }
    by_scope.into_iter().find_map(|(scope, d)| {
        (d.len() > 1).then(|| {
            let groups: Vec<String> = d.values().map(|rs| rs.join(",")).collect();
            format!(
                "scope {scope}: {} digests ({})",
                d.len(),
                groups.join(" | ")
            )
        })
    })
}

/// Every row one replica holds under `prefix`, read from it alone.
async fn scan_all(client: &Client, replica: &ReplicaId, prefix: &str) -> Result<Vec<Cell>> {
    let mut cells = Vec::new();
    let mut scan = ScanOptions {
        limit: 1_000,
        ..Default::default()
    };
    loop {
        let page = client
            .scan_at(
                replica,
                TABLE,
                Bytes::copy_from_slice(prefix.as_bytes()),
                &scan,
                &Default::default(),
                Duration::from_secs(10),
            )
            .await
            .with_context(|| format!("scanning {prefix:?} on {replica}"))?;
        for row in &page.rows {
            if let Some((value, version)) = value_cell(row) {
                cells.push(Cell {
                    key: String::from_utf8_lossy(&row.key).into_owned(),
                    value,
                    version,
                });
            }
        }
        if page.resume_key.is_empty() {
            return Ok(cells);
        }
        scan.resume_after = page.resume_key;
    }
}
