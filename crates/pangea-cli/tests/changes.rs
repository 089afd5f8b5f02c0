//! Change streams on a live local cluster (issue 38 point 1, docs/client.md
//! "Change streams"): a `pangea changes --follow` consumer killed with SIGKILL
//! and resumed from the last cursor it printed, 20 times, while frontends
//! write, sees every acknowledged write at least once, each origin's in order;
//! a consumer in the US never sees an EU-resident row.

mod common;

use anyhow::{Context, Result, ensure};
use common::{Cluster, EU, PANGEA, US, sigkill};
use pangea_client::{ChangesFrom, Mutation, RowMutation, WriteOptions};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const TABLE: &str = "ad_profiles";
/// Rows each writer writes (each row once).
const ROWS: usize = 400;

/// A change's name: (scope, origin, sequence).
type Name = (String, String, u64);

/// What one run of the consumer printed: its changes (name, row key) in order,
/// and the last cursor.
struct Run {
    changes: Vec<(Name, String)>,
    cursor: Option<String>,
}

/// Runs `pangea changes --json ARGS` until it exits, or kills it with SIGKILL
/// after `kill_after`.
fn consume(c: &Cluster, region: &str, args: &[&str], kill_after: Option<Duration>) -> Result<Run> {
    let cluster = c.cluster_path();
    let mut child = Command::new(PANGEA)
        .args(["changes", "--json", "--cluster"])
        .arg(&cluster)
        .args(["--region", region, "--deadline-ms", "5000"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + kill_after.unwrap_or(Duration::from_secs(60));
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if child.try_wait()?.is_none() {
        sigkill(child.id());
    }
    let status = child.wait()?;
    let _ = reader.join();
    if kill_after.is_none() {
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().context("stderr")?, &mut err)?;
        ensure!(status.success(), "pangea changes failed: {err}");
    }
    let mut run = Run {
        changes: Vec::new(),
        cursor: None,
    };
    for line in rx.try_iter() {
        let v: serde_json::Value = serde_json::from_str(&line).with_context(|| line.clone())?;
        if let Some(cursor) = v["cursor"].as_str() {
            run.cursor = Some(cursor.to_owned());
            continue;
        }
        let name = (
            v["scope"].as_str().context("scope")?.to_owned(),
            v["origin"].as_str().context("origin")?.to_owned(),
            v["sequence"].as_u64().context("sequence")?,
        );
        run.changes
            .push((name, v["key"].as_str().context("key")?.to_owned()));
    }
    Ok(run)
}

#[test]
fn a_consumer_killed_and_resumed_twenty_times_sees_every_acknowledged_write() -> Result<()> {
    let c = Cluster::up(false)?;
    let rt = common::runtime()?;
    // The stream from now, before any write.
    let start = consume(&c, US, &["--prefix", "cs/"], None)?;
    let mut cursor = start.cursor.context("a cursor from now")?;
    ensure!(start.changes.is_empty());
    // Two frontends in the US write global rows, one in the EU writes
    // EU-resident rows, each row once; acknowledged writes by name.
    let writers = std::thread::spawn({
        let clients = rt.block_on(async {
            Ok::<_, anyhow::Error>([
                (c.client(US, "frontend").await?, "cs/a-"),
                (c.client(US, "frontend").await?, "cs/b-"),
                (c.client(EU, "frontend").await?, "eu/cs-"),
            ])
        })?;
        let handle = rt.handle().clone();
        move || -> Result<BTreeMap<Name, String>> {
            handle.block_on(async {
                let tasks = clients.map(|(client, prefix)| {
                    tokio::spawn(async move {
                        let mut acked = BTreeMap::new();
                        for i in 0..ROWS {
                            let key = format!("{prefix}{i:04}");
                            let m = Mutation::SetCell {
                                family: "profile".into(),
                                column: bytes::Bytes::from_static(b"p"),
                                value: format!("v{i}").into(),
                            };
                            let m =
                                RowMutation::new(TABLE, key.clone(), vec![m], &Default::default())?;
                            if let Ok(r) = client.mutate(m, &WriteOptions::default()).await {
                                let t = r.value;
                                acked.insert(
                                    (t.scope.to_string(), t.origin.to_string(), t.sequence),
                                    key,
                                );
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Ok::<_, anyhow::Error>(acked)
                    })
                });
                let mut all = BTreeMap::new();
                for t in tasks {
                    all.extend(t.await??);
                }
                Ok(all)
            })
        }
    });
    // The consumer, killed 20 times at random moments and resumed from the
    // last cursor it printed.
    let mut seen: BTreeMap<Name, String> = BTreeMap::new();
    let (mut delivered, mut kills) = (0, 0);
    let mut check_run = |run: &Run, seen: &mut BTreeMap<Name, String>| -> Result<()> {
        // Each origin's changes in its order within a run.
        let mut last: BTreeMap<(String, String), u64> = BTreeMap::new();
        for (name, key) in &run.changes {
            let (scope, origin, seq) = name;
            let prev = last.insert((scope.clone(), origin.clone()), *seq);
            ensure!(prev.is_none_or(|p| p < *seq), "{name:?} after #{prev:?}");
            ensure!(
                !key.starts_with("eu/"),
                "an EU-resident row in the US: {key}"
            );
            // A change seen twice is the same change.
            if let Some(k) = seen.insert(name.clone(), key.clone()) {
                ensure!(&k == key, "{name:?} was {k}, now {key}");
            }
        }
        delivered += run.changes.len();
        Ok(())
    };
    let mut rng = 7u64;
    for _ in 0..20 {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let after = Duration::from_millis(300 + (rng >> 33) % 500);
        let run = consume(
            &c,
            US,
            &[
                "--prefix",
                "cs/",
                "--follow",
                "--poll-ms",
                "20",
                "--limit",
                "50",
                "--from",
                &cursor,
            ],
            Some(after),
        )?;
        kills += 1;
        check_run(&run, &mut seen)?;
        if let Some(cur) = run.cursor {
            cursor = cur;
        }
    }
    let acked = writers.join().expect("writers")?;
    // Caught up: the rest, without --follow.
    let rest = consume(&c, US, &["--prefix", "cs/", "--from", &cursor], None)?;
    check_run(&rest, &mut seen)?;
    let global: BTreeMap<&Name, &String> =
        acked.iter().filter(|(_, k)| k.starts_with("cs/")).collect();
    ensure!(
        global.len() >= 2 * ROWS * 9 / 10,
        "{} of {} writes acknowledged",
        global.len(),
        2 * ROWS
    );
    let missing: Vec<_> = global
        .iter()
        .filter(|(n, _)| !seen.contains_key(**n))
        .collect();
    ensure!(
        missing.is_empty(),
        "{} acknowledged writes never seen: {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    for (name, key) in &global {
        ensure!(
            seen[*name] == **key,
            "{name:?}: {key} acknowledged, {} seen",
            seen[*name]
        );
    }
    let origins: BTreeSet<&str> = seen.keys().map(|(_, o, _)| o.as_str()).collect();
    println!(
        "{} acknowledged global writes, {} changes delivered over {kills} kills and a last run \
         ({} distinct, from origins {origins:?})",
        global.len(),
        delivered,
        seen.len()
    );
    // The EU-resident rows are in the EU's stream.
    let eu = consume(&c, EU, &["--prefix", "eu/cs-", "--from", "earliest"], None)?;
    let eu_keys: BTreeSet<&String> = eu.changes.iter().map(|(_, k)| k).collect();
    let eu_acked: BTreeSet<&String> = acked.values().filter(|k| k.starts_with("eu/")).collect();
    ensure!(
        !eu_acked.is_empty() && eu_acked.is_subset(&eu_keys),
        "EU stream: {} of {}",
        eu_keys.len(),
        eu_acked.len()
    );
    Ok(())
}

/// A table without a change stream (a system table, read by the operator, who
/// may read those), a malformed cursor and an unknown table are refused, each
/// naming what was wrong.
#[test]
fn bad_requests_are_refused_by_name() -> Result<()> {
    let c = Cluster::up(false)?;
    let run = |args: &[&str]| -> Result<String> {
        let out = common::pangea(
            &[
                &[
                    "changes",
                    "--cluster",
                    c.cluster_path().to_str().unwrap(),
                    "--region",
                    US,
                ],
                args,
            ]
            .concat(),
            Duration::from_secs(30),
        )?;
        ensure!(!out.status.success(), "{args:?} succeeded");
        Ok(String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let e = run(&["--table", "_jobs", "--credential", "operator/operator"])?;
    ensure!(e.contains("table \"_jobs\" has no change stream"), "{e}");
    let e = run(&["--from", "0xffff"])?;
    ensure!(e.contains("cursor: not a change cursor"), "{e}");
    let e = run(&["--table", "nope"])?;
    ensure!(e.contains("unknown table \"nope\""), "{e}");
    Ok(())
}

/// A registered reader (`pangea changes --reader`, docs/client.md "Registered
/// readers"): with a 1 s retention, the replica a loader's reader registered
/// with keeps the log after its cursor, so the reader reads every write it
/// missed seconds later, while another replica has purged it (its cursor is
/// refused there); a frontend's client certificate may not register one.
#[test]
fn a_registered_reader_reads_on_past_the_retention() -> Result<()> {
    let c = Cluster::up_with(
        "topology/local-3-regions.toml",
        "crates/pangea-cli/tests/data/changes-1s.placement.toml",
        false,
    )?;
    let rt = common::runtime()?;
    rt.block_on(async {
        let writer = c.client(US, "frontend").await?;
        let config = pangea_client::ClientConfig::from_cluster(
            &pangea_topology::cluster::ClusterFile::load(&c.cluster_path())
                .map_err(anyhow::Error::msg)?,
            US,
            "frontend",
        )?
        .with_credential(pangea_client::Credential::Loader("loader-frontend".into()));
        let loader = pangea_client::Client::connect(config).await?;
        let (held, other) = (
            pangea_core::ReplicaId::new("use1-a"),
            pangea_core::ReplicaId::new("use1-b"),
        );
        let deadline = Duration::from_secs(5);
        let read = |at: &pangea_core::ReplicaId, reader: &'static str, from: ChangesFrom| {
            let (loader, at) = (&loader, at.clone());
            async move {
                loader
                    .read_changes_at(&at, reader, TABLE, "rr/".into(), &from, 1_000, deadline)
                    .await
            }
        };
        // Registered at now on use1-a.
        let start = read(&held, "pipeline", ChangesFrom::Now).await?.cursor;
        let mut keys = Vec::new();
        for i in 0..30 {
            let key = format!("rr/{i:03}");
            writer
                .mutate(
                    common::profile_set(key.clone(), "v")?,
                    &common::setup_writes(),
                )
                .await?;
            keys.push(key);
        }
        // use1-b, where no reader holds it, purges the log after the retention.
        common::eventually(
            Duration::from_secs(20),
            Duration::from_millis(200),
            "use1-b purging its log",
            || async {
                match read(&other, "", ChangesFrom::Cursor(start.clone())).await {
                    Err(pangea_client::Error::CursorExpired(_)) => Ok(Some(())),
                    _ => Ok(None),
                }
            },
        )
        .await?;
        // use1-a kept it for the reader: every write, from its cursor.
        let page = read(&held, "pipeline", ChangesFrom::Cursor(start.clone())).await?;
        // Every write (two origins' streams, one after the other).
        let seen: BTreeSet<String> = page
            .changes
            .iter()
            .map(|c| String::from_utf8_lossy(c.mutation.row_key()).into_owned())
            .collect();
        ensure!(
            page.changes.len() == keys.len() && seen == keys.iter().cloned().collect(),
            "the reader read {seen:?}"
        );
        // A client certificate may not register a reader.
        let e = writer
            .read_changes_as(
                "sneaky",
                TABLE,
                bytes::Bytes::new(),
                &ChangesFrom::Now,
                1,
                // The refusal is what is checked: the default 20 ms deadline
                // failed it once on a busy CI machine, before any answer.
                &pangea_client::ReadOptions::default().with_deadline(deadline),
            )
            .await
            .expect_err("a client registered a reader");
        ensure!(
            matches!(e, pangea_client::Error::PolicyForbids(_)) && e.to_string().contains("loader"),
            "{e}"
        );
        Ok(())
    })
}
