//! The main job on an embedded default (`pangea demo`). Starts a local multi-region
//! cluster with emulated WAN, loads sample ad profiles, runs clients in every region
//! in every consistency mode, and prints what they see — latency per region and
//! mode, hedges, fallbacks, replication lag — until Ctrl-C or `--duration`.

use crate::admin::Admin;
use crate::bench::{figures, histogram, machine};
use crate::local::{self, UpOptions};
use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use pangea_client::{
    AdProfile, Client, ClientConfig, Consistency, FrequencyCap, ReadOptions, Segment, Token,
    WriteOptions,
};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The default deployment, embedded so the demo runs from anywhere.
const TOPOLOGY: &str = include_str!("../../../topology/local-3-regions.toml");
const PLACEMENT: &str = include_str!("../../../topology/local-3-regions.placement.toml");

/// Sample users per home prefix.
const USERS_PER_HOME: usize = 200;
const HOMES: [&str; 3] = ["us/", "eu/", "apac/"];
const MODES: [&str; 4] = ["eventual", "affinity", "watermark", "bounded"];

/// A demo run (the flags of `pangea demo`).
#[derive(Debug, Clone)]
pub struct Options {
    /// A topology file (`None`: the embedded topology/local-3-regions.toml).
    pub topology: Option<PathBuf>,
    pub placement: Option<PathBuf>,
    /// Where the cluster lives (`None`: a fresh directory under the system temp
    /// dir, removed at the end).
    pub data_dir: Option<PathBuf>,
    /// Stop after this long (`None`: run until Ctrl-C).
    pub duration: Option<Duration>,
    pub clients_per_region: usize,
    /// Requests per second per client.
    pub rate: u64,
    /// Leave the cluster running at the end.
    pub keep: bool,
    /// Run every replica as this many processes (`None`: as the topology says).
    pub processes_per_replica: Option<u32>,
    /// Spread rows over this many shard groups (`None`: as the topology says;
    /// with `processes_per_replica` above 1, at least 4 per process).
    pub shard_groups: Option<u32>,
    /// The `pangea` binary the replicas run.
    pub binary: PathBuf,
}

#[derive(Default)]
struct Tally {
    /// (region, mode) -> latencies in µs.
    reads: BTreeMap<(String, &'static str), Histogram<u64>>,
    /// (region, mode) -> failed requests; writes under the mode "(writes)".
    errors: BTreeMap<(String, &'static str), u64>,
    /// Why requests failed: (mode, region, the error's kind) -> how often, and the
    /// first such error's text (texts carry figures: keyed by them, a long run's
    /// map would grow without bound).
    causes: BTreeMap<(&'static str, String, &'static str), (u64, String)>,
    writes: BTreeMap<String, Histogram<u64>>,
    /// Watermark reads answered by the first replica asked vs. after a fallback.
    local_covered: u64,
    fallback_covered: u64,
}

fn profile(user: &str, n: u64) -> AdProfile {
    let segments = [
        ("brand:Apple", 10),
        ("color:Red", 12),
        ("sport:Tennis", 7),
        ("travel:Japan", 4),
    ];
    AdProfile {
        user_id: user.to_owned(),
        segments: segments
            .iter()
            .map(|(name, score)| Segment {
                name: (*name).into(),
                score: score + (n % 5) as i32,
            })
            .collect(),
        frequency_caps: vec![FrequencyCap {
            campaign_id: "spring-sale".into(),
            impressions: (n % 3) as u32,
            limit: 5,
            window_start_unix_ms: 0,
            window_seconds: 86_400,
        }],
        embedding: (0..32)
            .map(|i| ((i as u64 * 7 + n) % 100) as f32 / 100.0)
            .collect(),
        update_time_unix_ms: 0,
    }
}

/// The topology text with `shard_groups` and every replica's `processes` set
/// (comments kept). With processes but no groups, the groups are at least 4 per
/// process, so that each process hosts several (docs/sharding.md, choosing G).
pub fn with_layout(text: &str, groups: Option<u32>, processes: Option<u32>) -> Result<String> {
    let mut doc: toml_edit::DocumentMut = text.parse().context("not TOML")?;
    let file_groups = doc
        .get("shard_groups")
        .and_then(|v| v.as_integer())
        .unwrap_or(1);
    let groups = match (groups, processes) {
        (Some(g), _) => Some(i64::from(g)),
        (None, Some(p)) if i64::from(p) * 4 > file_groups => Some(i64::from(p) * 4),
        (None, _) => None,
    };
    if let Some(g) = groups {
        doc["shard_groups"] = toml_edit::value(g);
    }
    if let Some(p) = processes {
        local::for_each_replica(&mut doc, |r| {
            r["processes"] = toml_edit::value(i64::from(p));
        });
    }
    Ok(doc.to_string())
}

/// Starts the cluster, loads it, runs the clients and reports through `say`
/// every 10 s and at the end.
pub fn run(a: &Options, say: &(dyn Fn(&str) + Sync)) -> Result<()> {
    let dir = match &a.data_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("pangea-demo-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    let (topology, placement) = match (&a.topology, &a.placement) {
        (Some(t), p) => (t.clone(), p.clone()),
        (None, _) => {
            let t = dir.join("demo-topology.toml");
            let p = dir.join("demo-placement.toml");
            std::fs::write(&t, TOPOLOGY)?;
            std::fs::write(&p, PLACEMENT)?;
            (t, Some(p))
        }
    };
    let topology = if a.processes_per_replica.is_some() || a.shard_groups.is_some() {
        let text = std::fs::read_to_string(&topology)
            .with_context(|| format!("reading {}", topology.display()))?;
        let text = with_layout(&text, a.shard_groups, a.processes_per_replica)
            .with_context(|| format!("topology {}", topology.display()))?;
        let t = dir.join("demo-topology-layout.toml");
        std::fs::write(&t, text)?;
        t
    } else {
        topology
    };
    say(&format!(
        "Starting a local cluster from {} with emulated WAN in {} ...",
        topology.display(),
        dir.display()
    ));
    let started = Instant::now();
    let cluster = local::up(&UpOptions::emulated_wan(
        a.binary.clone(),
        topology,
        placement,
        dir.clone(),
    ))?;
    say(&format!(
        "  {} replicas healthy in {:.1} s ({})",
        cluster.replicas.len(),
        started.elapsed().as_secs_f64(),
        machine()
    ));
    for r in &cluster.replicas {
        say(&format!(
            "    {:<12} {:<16} quic {:<20} admin http://{}/metrics",
            r.id, r.region, r.address, r.admin
        ));
    }
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(workload(a, &cluster, say));
    if a.keep {
        say(&format!(
            "\nThe cluster keeps running. Stop it with: pangea cluster down --data-dir {}",
            dir.display()
        ));
    } else {
        local::down(&dir, Duration::from_secs(10))?;
        if a.data_dir.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    result
}

async fn workload(
    a: &Options,
    cluster: &pangea_topology::cluster::ClusterFile,
    say: &(dyn Fn(&str) + Sync),
) -> Result<()> {
    let regions: Vec<String> = {
        let mut r: Vec<String> = cluster.replicas.iter().map(|r| r.region.clone()).collect();
        r.dedup();
        r.sort();
        r.dedup();
        r
    };
    let mut clients: BTreeMap<String, Client> = BTreeMap::new();
    for region in &regions {
        let config = ClientConfig::from_cluster(cluster, region, "frontend")?;
        clients.insert(
            region.clone(),
            Client::connect(config)
                .await
                .with_context(|| format!("client in {region}"))?,
        );
    }
    // Load sample profiles, each from a client in its home region.
    let load_started = Instant::now();
    let home_region = |prefix: &str| match prefix {
        "us/" => "us-east-1",
        "eu/" => "eu-west-1",
        _ => "ap-northeast-1",
    };
    let mut users = Vec::new();
    let mut loaders = tokio::task::JoinSet::new();
    for home in HOMES {
        let client = clients
            .get(home_region(home))
            .or_else(|| clients.values().next())
            .context("no client")?
            .clone();
        let keys: Vec<String> = (0..USERS_PER_HOME)
            .map(|i| format!("{home}{i:05}"))
            .collect();
        users.extend(keys.clone());
        loaders.spawn(async move {
            for (n, k) in keys.iter().enumerate() {
                client
                    .put_profile(
                        k,
                        &profile(k, n as u64),
                        &WriteOptions {
                            deadline: Some(Duration::from_secs(5)),
                            ..Default::default()
                        },
                    )
                    .await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = loaders.join_next().await {
        r??;
    }
    say(&format!(
        "\nLoaded {} ad profiles in {:.1} s (homes: us/ → us-east-1, eu/ → eu-west-1 and EU-resident, apac/ → ap-northeast-1).",
        users.len(),
        load_started.elapsed().as_secs_f64()
    ));
    say(&format!(
        "Point a client at it, e.g.:\n  pangea get --cluster {} --region ap-northeast-1 us/00042 --consistency affinity",
        local::cluster_path(
            cluster
                .topology
                .parent()
                .unwrap_or(std::path::Path::new("."))
        )
        .display()
    ));
    let duration = a.duration;
    say(&format!(
        "\nRunning {} clients per region in every mode ({} req/s each){}. Ctrl-C to stop.",
        a.clients_per_region,
        a.rate,
        duration.map(|d| format!(" for {d:?}")).unwrap_or_default()
    ));

    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let deployment =
        pangea_topology::Deployment::load(&cluster.topology, cluster.placement.as_deref())
            .map_err(|p| anyhow::anyhow!("{p}"))?;
    let mut tasks = tokio::task::JoinSet::new();
    for (region, client) in &clients {
        // A frontend serves the users its region may hold: EU-resident profiles are
        // read only by EU frontends (elsewhere they would fail closed, by design).
        let here: Vec<&pangea_topology::ReplicaId> = deployment
            .topology
            .replicas
            .values()
            .filter(|r| r.region.as_str() == region)
            .map(|r| &r.id)
            .collect();
        let local: Vec<String> = users
            .iter()
            .filter(|u| {
                here.iter().any(|r| {
                    deployment.allowed(
                        r,
                        deployment.scope_of(pangea_client::PROFILE_TABLE, u.as_bytes()),
                    )
                })
            })
            .cloned()
            .collect();
        let users = Arc::new(local);
        for c in 0..a.clients_per_region {
            let (region, client, tally, stop, users) = (
                region.clone(),
                client.clone(),
                tally.clone(),
                stop.clone(),
                users.clone(),
            );
            let period = Duration::from_micros(1_000_000 / a.rate.max(1));
            tasks.spawn(
                async move { client_loop(region, c, client, tally, stop, users, period).await },
            );
        }
    }
    let run_started = Instant::now();
    let mut next_report = Instant::now() + Duration::from_secs(10);
    loop {
        let ctrl_c = tokio::signal::ctrl_c();
        let until_report = next_report.saturating_duration_since(Instant::now());
        let done = duration.is_some_and(|d| run_started.elapsed() >= d);
        if done {
            break;
        }
        let wait = duration.map_or(until_report, |d| {
            until_report.min(d.saturating_sub(run_started.elapsed()))
        });
        tokio::select! {
            _ = ctrl_c => break,
            _ = tokio::time::sleep(wait) => {}
        }
        if Instant::now() >= next_report {
            print_report(&tally, &clients, cluster, run_started.elapsed(), false, say).await;
            next_report += Duration::from_secs(10);
        }
    }
    stop.store(true, Ordering::Relaxed);
    while tasks.join_next().await.is_some() {}
    print_report(&tally, &clients, cluster, run_started.elapsed(), true, say).await;
    Ok(())
}

async fn client_loop(
    region: String,
    n: usize,
    client: Client,
    tally: Arc<Mutex<Tally>>,
    stop: Arc<AtomicBool>,
    users: Arc<Vec<String>>,
    period: Duration,
) {
    let mut rng = pangea_core::rng::Rng::new(((n as u64 + 1) << 20) ^ region.len() as u64);
    // The token of this client's last write and the row it wrote: watermark reads
    // read that row back (read-your-writes, from anywhere).
    let mut last: Option<(Token, String)> = None;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        i += 1;
        let user = &users[rng.next_below(users.len())];
        if i.is_multiple_of(10) {
            // An event-driven profile update, from this region.
            let t0 = Instant::now();
            let result = client
                .put_profile(user, &profile(user, i), &WriteOptions::default())
                .await;
            let mut t = tally.lock().expect("not poisoned");
            match result {
                Ok(r) => {
                    last = Some((r.value, user.clone()));
                    let _ = t
                        .writes
                        .entry(region.clone())
                        .or_insert_with(histogram)
                        .record(t0.elapsed().as_micros() as u64);
                }
                Err(e) => t.failed(&region, WRITES, &e),
            }
            continue;
        }
        let mode = MODES[(i % MODES.len() as u64) as usize];
        let consistency = match (mode, &last) {
            ("watermark", Some((t, _))) => Consistency::Watermark(t.clone()),
            ("watermark", None) => continue,
            ("affinity", _) => Consistency::RowAffinity,
            ("bounded", _) => Consistency::BoundedStaleness { max_ms: 1_000 },
            _ => Consistency::Eventual,
        };
        let key = match (&consistency, &last) {
            (Consistency::Watermark(_), Some((_, k))) => k.clone(),
            _ => user.clone(),
        };
        let t0 = Instant::now();
        let result = client
            .get_profile(&key, &ReadOptions::default().with_consistency(consistency))
            .await;
        let mut t = tally.lock().expect("not poisoned");
        match result {
            Ok(r) => {
                let _ = t
                    .reads
                    .entry((region.clone(), mode))
                    .or_insert_with(histogram)
                    .record(t0.elapsed().as_micros() as u64);
                if mode == "watermark" {
                    if r.attempts == 1 {
                        t.local_covered += 1
                    } else {
                        t.fallback_covered += 1
                    }
                }
            }
            Err(e) => t.failed(&region, mode, &e),
        }
    }
}

/// The causes of failures a report lists.
const CAUSES_SHOWN: usize = 5;

/// The mode column of the writes' row.
const WRITES: &str = "(writes)";

impl Tally {
    fn failed(&mut self, region: &str, mode: &'static str, e: &pangea_client::Error) {
        *self.errors.entry((region.to_owned(), mode)).or_default() += 1;
        self.causes
            .entry((mode, region.to_owned(), e.kind()))
            .or_insert_with(|| (0, e.to_string()))
            .0 += 1;
    }
}

async fn print_report(
    tally: &Mutex<Tally>,
    clients: &BTreeMap<String, Client>,
    cluster: &pangea_topology::cluster::ClusterFile,
    elapsed: Duration,
    last: bool,
    say: &(dyn Fn(&str) + Sync),
) {
    let (reads, errors, causes, writes, local, fallback) = {
        let t = tally.lock().expect("not poisoned");
        (
            t.reads.clone(),
            t.errors.clone(),
            t.causes.clone(),
            t.writes.clone(),
            t.local_covered,
            t.fallback_covered,
        )
    };
    say(&format!(
        "\n{} after {:.0} s — read latency by client region and consistency mode (ms):",
        if last { "Final" } else { "Progress" },
        elapsed.as_secs_f64()
    ));
    say(&format!(
        "  {:<16} {:<10} {:>8} {:>7} {:>8} {:>8} {:>8}",
        "REGION", "MODE", "READS", "ERRORS", "P50", "P99", "P999"
    ));
    let mut regions: Vec<&String> = clients.keys().collect();
    regions.sort();
    for region in &regions {
        for mode in MODES {
            let key = ((*region).clone(), mode);
            let failed = errors.get(&key).copied();
            let h = match (reads.get(&key), failed) {
                (Some(h), _) => h.clone(),
                // Every read failed: the row still shows.
                (None, Some(_)) => histogram(),
                (None, None) => continue,
            };
            let f = figures(&h, failed.unwrap_or(0), elapsed);
            say(&format!(
                "  {:<16} {:<10} {:>8} {:>7} {:>8.2} {:>8.2} {:>8.2}",
                region, mode, f.count, f.errors, f.p50_ms, f.p99_ms, f.p999_ms
            ));
        }
        let failed = errors.get(&((*region).clone(), WRITES)).copied();
        if let Some(h) = writes.get(*region).cloned().or(failed.map(|_| histogram())) {
            let f = figures(&h, failed.unwrap_or(0), elapsed);
            say(&format!(
                "  {:<16} {:<10} {:>8} {:>7} {:>8.2} {:>8.2} {:>8.2}",
                region, WRITES, f.count, f.errors, f.p50_ms, f.p99_ms, f.p999_ms
            ));
        }
    }
    // Why requests failed, most frequent first.
    let mut causes: Vec<(u64, String)> = causes
        .into_iter()
        .map(|((mode, region, _), (n, first))| (n, format!("{mode} from {region}: {first}")))
        .collect();
    causes.sort_unstable_by(|a, b| b.cmp(a));
    for (n, cause) in causes.iter().take(CAUSES_SHOWN) {
        say(&format!("  {n} × {cause}"));
    }
    if causes.len() > CAUSES_SHOWN {
        say(&format!(
            "  ... and {} other causes",
            causes.len() - CAUSES_SHOWN
        ));
    }
    let (mut hedges, mut fallbacks, mut failovers) = (0, 0, 0);
    for c in clients.values() {
        hedges += c.stats().hedges.load(Ordering::Relaxed);
        fallbacks += c.stats().fallbacks.load(Ordering::Relaxed);
        failovers += c.stats().failovers.load(Ordering::Relaxed);
    }
    say(&format!(
        "  hedges {hedges}, watermark fallbacks {fallbacks}, failovers {failovers}; watermark reads answered by the first replica asked: {local}, after a fallback: {fallback}"
    ));
    // Replication lag: how far each replica's watermark for each other origin is
    // behind now, from the admin endpoints. Their HTTP calls block: off the
    // runtime, so that the clients on its workers do not wait behind them.
    let admins: Vec<(String, String)> = cluster
        .replicas
        .iter()
        .map(|r| (r.id.clone(), r.admin.clone()))
        .collect();
    let mut lags = tokio::task::spawn_blocking(move || {
        let mut lags: Vec<u64> = Vec::new();
        for (id, admin) in &admins {
            if let Ok(w) = Admin::new(admin).and_then(|a| a.watermarks()) {
                for s in &w.scopes {
                    for (origin, o) in &s.origins {
                        if origin != id {
                            lags.push(o.lag_ms);
                        }
                    }
                }
            }
        }
        lags
    })
    .await
    .unwrap_or_default();
    lags.sort_unstable();
    if !lags.is_empty() {
        let q = |p: f64| lags[((lags.len() - 1) as f64 * p) as usize];
        say(&format!(
            "  replication lag (watermark age of other origins, incl. idle heartbeat gaps): p50 {} ms, p99 {} ms, max {} ms",
            q(0.5),
            q(0.99),
            lags[lags.len() - 1]
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// `--processes-per-replica 2` on the embedded topology: every replica runs
    /// 2 processes over 8 groups, and the file still checks.
    #[test]
    fn the_demo_layout_sets_processes_and_enough_groups() {
        let text = with_layout(TOPOLOGY, None, Some(2)).unwrap();
        let d = pangea_topology::Deployment::parse(
            Path::new("t.toml"),
            &text,
            Some((Path::new("p.toml"), PLACEMENT)),
        )
        .unwrap();
        assert_eq!(d.topology.shard_groups, 8);
        let firsts: Vec<_> = d
            .topology
            .replicas
            .values()
            .filter(|r| r.index == 0)
            .collect();
        assert!(!firsts.is_empty());
        assert!(firsts.iter().all(|r| r.processes == 2));
        assert_eq!(d.topology.replicas.len(), 2 * firsts.len());
        // Groups asked for win; no flags, no change.
        let text = with_layout(TOPOLOGY, Some(32), Some(2)).unwrap();
        assert!(text.contains("shard_groups = 32"), "{text}");
        assert_eq!(with_layout(TOPOLOGY, None, None).unwrap(), TOPOLOGY);
    }
}
