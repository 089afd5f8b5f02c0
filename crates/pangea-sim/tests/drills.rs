//! Drill files: the shipped ones validate, broken ones are reported with file,
//! line and key, a drill replays to the same trace hash (C6), and every fault kind
//! runs without breaking an invariant.

use anyhow::Result;
use pangea_sim::SimDuration;
use pangea_sim::drill::{Drill, drill_files};
use pangea_sim::scenario::FaultKind;
use pangea_sim::sim::Simulation;
use pangea_sim::sim::metrics::FRONTENDS;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn drill(name: &str, text: &str) -> Result<Drill> {
    // Relative paths resolve against the ancestors of the drill's directory.
    let file = root().join("sim/drills").join(name);
    Drill::parse(&file, text).map_err(|p| anyhow::anyhow!("{p}"))
}

#[test]
fn every_shipped_drill_validates() -> Result<()> {
    let files = drill_files(&root().join("sim/drills"))?;
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    for required in [
        "region-outage",
        "continent-partition",
        "lossy-transatlantic",
        "clock-skew",
        "relay-loss",
        "placement-migration-under-load",
        "placement-move-under-load",
        "rolling-restart",
        "counters-continent-partition",
        "backup-during-region-loss",
    ] {
        assert!(
            names.iter().any(|n| n == required),
            "missing drill {required}"
        );
    }
    let mut scopes = std::collections::BTreeSet::new();
    for f in files {
        let d = Drill::load(&f).map_err(|p| anyhow::anyhow!("{p}"))?;
        assert!(
            !d.scenario.faults.is_empty(),
            "{} has no fault",
            f.display()
        );
        // The reference deployment, or its five-continent growth (39 replicas),
        // each replica once however many processes it runs.
        let topology = &d.scenario.deployment.topology;
        let replicas = topology.replicas.values().filter(|r| r.index == 0).count();
        assert!([27, 39].contains(&replicas), "{}: {replicas}", f.display());
        let processes = topology.replicas.values().map(|r| r.processes).max();
        let expected = if f
            .file_stem()
            .is_some_and(|n| n.to_string_lossy().starts_with("sharded-processes-"))
        {
            2
        } else {
            1
        };
        assert_eq!(processes, Some(expected), "{}", f.display());
        assert_eq!(topology.replicas.len(), expected as usize * replicas);
        // The workload's rows are the placement's own, so its key prefixes reach
        // the policies the placement's rules give them.
        let w = &d.scenario.workload;
        assert_eq!(w.table, "ad_profiles", "{}", f.display());
        for p in w.prefixes.values().chain([&w.global_prefix]) {
            let key = format!("{p}00000001");
            scopes.insert(
                d.scenario
                    .deployment
                    .scope_of(&w.table, key.as_bytes())
                    .policy()
                    .to_owned(),
            );
        }
    }
    // Residency is rehearsed, not only global rows.
    for scope in ["global", "eu-resident", "apac"] {
        assert!(scopes.contains(scope), "no drill writes {scope} rows");
    }
    Ok(())
}

/// `sim/reference.toml`, the run of the speed target (`tests/speed.rs` and `pangea
/// sim run` both run it): it loads, and it is what its comment says.
#[test]
fn the_reference_run_file_is_the_speed_target() -> Result<()> {
    let d = Drill::load(&root().join("sim/reference.toml")).map_err(|p| anyhow::anyhow!("{p}"))?;
    let sc = &d.scenario;
    assert_eq!(sc.deployment.topology.replicas.len(), 27);
    assert!(sc.faults.is_empty());
    assert_eq!(sc.duration, SimDuration::from_secs(600));
    let rate: f64 = sc.workload.regions.iter().map(|r| r.rate).sum();
    assert!((rate - 5_000.0).abs() < 1e-6, "{rate} operations/s");
    assert_eq!(sc.replica.heartbeat_interval_ms, 50);
    assert_eq!(
        (sc.workload.table.as_str(), sc.workload.family.as_str()),
        ("ad_profiles", "profile")
    );
    Ok(())
}

/// `sim/capacity-sharded.toml`, the capacity model of processes per replica
/// (docs/benchmarks.md): 64 groups, one process per replica until edited, no
/// faults, and a workload of 20,000 rows per prefix of one column each (all
/// written first with `--fill`), so that a read costs the same at every rate.
#[test]
fn the_capacity_model_file_is_what_its_comment_says() -> Result<()> {
    let d = Drill::load(&root().join("sim/capacity-sharded.toml"))
        .map_err(|p| anyhow::anyhow!("{p}"))?;
    let sc = &d.scenario;
    let topology = &sc.deployment.topology;
    assert_eq!(topology.shard_groups, 64);
    assert_eq!(topology.replicas.len(), 27);
    assert!(sc.faults.is_empty());
    assert_eq!((sc.workload.keys, sc.workload.columns), (20_000, 1));
    // The edit the docs tell: `processes = P` runs P hosts per replica.
    let text = std::fs::read_to_string(root().join("sim/capacity-sharded.toml"))?
        .replace("processes = 1", "processes = 16");
    let d = drill("capacity-16.toml", &text)?;
    assert_eq!(d.scenario.deployment.topology.replicas.len(), 27 * 16);
    Ok(())
}

/// The scale run is as large as issue 35 asks: at least 100 replica processes and
/// 100,000 operations a second for 60 virtual seconds.
#[test]
fn the_scale_run_file_is_large() -> Result<()> {
    let d =
        Drill::load(&root().join("sim/large/large.toml")).map_err(|p| anyhow::anyhow!("{p}"))?;
    let sc = &d.scenario;
    assert!(sc.deployment.topology.replicas.len() >= 100);
    assert!(sc.deployment.topology.regions.len() >= 14);
    let rate: f64 = sc.workload.regions.iter().map(|r| r.rate).sum();
    assert!(rate >= 100_000.0 - 1e-6, "{rate} operations/s");
    assert_eq!(sc.duration, SimDuration::from_secs(60));
    Ok(())
}

const HEAD: &str = r#"
topology = "topology/four-continents.toml"
placement = "topology/placement.toml"
seed = 11
duration = "4s"
drain_max = "30s"
[workload]
rate = 300
keys = 500
prefixes = { europe = "eu/", asia = "apac/", oceania = "apac/", north-america = "us/" }
local_fraction = 0.6
modes = { eventual = 0.4, affinity = 0.2, watermark = 0.3, bounded = 0.1 }
mix = { read = 0.8, write = 0.17, delete = 0.03 }
"#;

/// `shard_groups` runs the files' deployment at another G: every policy then
/// replicates as that many scopes; a G out of range is named with its line.
#[test]
fn a_drill_may_spread_rows_over_shard_groups() -> Result<()> {
    let text = HEAD.replacen("seed = 11", "shard_groups = 8\nseed = 11", 1);
    let d = drill("sharded.toml", &text)?;
    let deployment = &d.scenario.deployment;
    assert_eq!(deployment.topology.shard_groups, 8);
    assert_eq!(
        deployment.scopes().count(),
        8 * deployment.policies().count()
    );
    let scope = deployment.scope_of("ad_profiles", b"eu/00000001");
    assert_eq!(scope.policy(), "eu-resident");
    assert!(scope.group().is_some(), "{scope}");
    let bad = HEAD.replacen("seed = 11", "shard_groups = 0\nseed = 11", 1);
    let err = drill("bad.toml", &bad).unwrap_err().to_string();
    assert!(
        err.contains("bad.toml:4: shard_groups: shard_groups must be 1 ..= 4096, got 0"),
        "{err}"
    );
    Ok(())
}

/// Increments in the mix go to a counter family of the workload's table: a
/// family of cells is refused, naming the key; with a counter family, a short
/// run counts every acknowledged increment everywhere (C8) and says how many.
#[test]
fn a_workload_counts_into_a_counter_family() -> Result<()> {
    let mix = "mix = { read = 0.8, write = 0.1, delete = 0.0, increment = 0.1 }";
    let bad = HEAD
        .replace("mix = { read = 0.8, write = 0.17, delete = 0.03 }", mix)
        .replace("[workload]", "[workload]\ncounter_family = \"events\"");
    let err = drill("bad.toml", &bad).unwrap_err().to_string();
    assert!(
        err.contains("workload.counter_family") && err.contains("\"events\" is not one"),
        "{err}"
    );
    let text = bad.replace(
        "counter_family = \"events\"",
        "counter_family = \"impressions\"",
    );
    let d = drill("counters.toml", &text)?;
    let r = pangea_sim::sim::run_scenario(d.scenario, 1)?;
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert_eq!(r.lost_increments, 0);
    assert!(
        r.counters.increments_acknowledged > 50,
        "{}",
        r.counters.increments_acknowledged
    );
    Ok(())
}

/// Batch writes in the mix (`MutateRows`): each batch is one request of rows of
/// one key prefix; a size out of the replicas' limit is named with its line. A
/// run with a replica killed and brought back mid-load answers batches, counts
/// their rows, and holds every acknowledged row to C1 (no lost write) and C5
/// (every replica converges on them).
#[test]
fn a_workload_writes_batches_of_rows() -> Result<()> {
    let mix = "mix = { read = 0.7, write = 0.1, delete = 0.0, batch = 0.2 }";
    let bad = HEAD
        .replace("mix = { read = 0.8, write = 0.17, delete = 0.03 }", mix)
        .replace("[workload]", "[workload]\nbatch_rows = 1001");
    let err = drill("bad.toml", &bad).unwrap_err().to_string();
    assert!(
        err.contains("bad.toml:8: workload.batch_rows: 1001 rows: a batch write has 1 to 1000"),
        "{err}"
    );
    let text = format!(
        r#"{}
[[faults]]
at = "1s"
kind = "crash-replica"
replica = "euc1-a"
for = "1500ms"
"#,
        bad.replace("batch_rows = 1001", "batch_rows = 16")
    );
    let d = drill("batches.toml", &text)?;
    // Whole, and split in two shards (requests and answers of batches crossing
    // between them).
    let whole = Simulation::new(d.scenario.clone())?.run()?;
    let split = pangea_sim::sim::run_scenario(d.scenario, 1)?;
    assert_eq!((whole.shards, split.shards), (1, 2));
    for r in [whole, split] {
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.lost_writes, 0);
        assert!(r.final_convergence_ms.is_some());
        let b = &r.batches;
        println!(
            "{} shard(s): batches {b:?}; rows acknowledged {}, refused {}; writes {:?}",
            r.shards, r.counters.batch_rows_acknowledged, r.counters.batch_rows_refused, r.writes
        );
        assert!(b.count > 100 && b.count < r.operations / 3, "{b:?}");
        // Batches a crash cut off (their replica gone before the rows were
        // durable) fail or fail over; nearly all are answered.
        assert!(b.errors * 50 < b.count, "{b:?}");
        let answered = b.count - b.errors;
        let c = &r.counters;
        assert!(
            c.batch_rows_acknowledged + c.batch_rows_refused >= 16 * answered
                && c.batch_rows_acknowledged > 15 * answered,
            "{answered} batches answered, {c:?}"
        );
        assert!(b.p50_ms > 0.0 && b.p99_ms < 200.0, "{b:?}");
    }
    Ok(())
}

/// A placement move on replicas of many processes: the job on process 0 of its
/// runner's replica, a part on process 1 for its groups; the rows reach the new
/// policy whole (C5), leave the others (I10 at rest), and no write is lost.
#[test]
fn a_placement_move_runs_on_replicas_of_many_processes() -> Result<()> {
    let text = format!(
        r#"{}
[[faults]]
at = "1s"
kind = "migrate"
table = "ad_profiles"
prefix = "us/"
to = "eu-resident"
"#,
        HEAD.replacen("seed = 11", "shard_groups = 8\nprocesses = 2\nseed = 11", 1)
    );
    let d = drill("sharded-move.toml", &text)?;
    let r = Simulation::new(d.scenario)?.run()?;
    assert_eq!(r.migrations.len(), 1, "{:?}", r.violations);
    let m = &r.migrations[0];
    assert_eq!(
        (m.runner.as_str(), m.phase.as_str()),
        ("euc1-a", "done"),
        "{m:?}"
    );
    assert!(m.rows_copied > 0 && m.rows_copied >= m.rows_total, "{m:?}");
    assert_eq!(r.lost_writes, 0, "{:?}", r.violations);
    assert_eq!(r.residency_leak_bytes, 0, "{:?}", r.violations);
    assert!(r.final_convergence_ms.is_some(), "{:?}", r.violations);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    Ok(())
}

#[test]
fn problems_name_file_line_and_key() {
    let text = format!(
        "{HEAD}\n[[faults]]\nat = \"1s\"\nkind = \"lose-region\"\nregion = \"mars-1\"\n\n[[faults]]\nat = \"soon\"\nkind = \"partition\"\na = [\"europe\"]\nb = [\"europe\"]\nlatency_ms = 3\n"
    );
    let err = drill("bad.toml", &text).unwrap_err().to_string();
    assert!(err.contains("bad.toml:"), "{err}");
    assert!(
        err.contains("faults[0].region: unknown region \"mars-1\""),
        "{err}"
    );
    assert!(
        err.contains("faults[1].at: invalid duration \"soon\""),
        "{err}"
    );
    assert!(
        err.contains("faults[1].latency_ms: `latency_ms` does not apply"),
        "{err}"
    );
    assert!(err.contains("is on both sides"), "{err}");
    // The line of the unknown region: HEAD's lines, then the fault's fifth line.
    let line = HEAD.lines().count() + 5;
    assert!(
        err.contains(&format!("bad.toml:{line}: faults[0].region")),
        "{err}"
    );

    let unknown = format!("{HEAD}\n[expect]\np99 = 3\n");
    let err = drill("unknown.toml", &unknown).unwrap_err().to_string();
    assert!(err.contains("unknown.toml:"), "{err}");
    assert!(err.contains("expect"), "{err}");
    assert!(err.contains("unknown field `p99`"), "{err}");

    // A system table is global whatever the rules say: a workload on it would
    // rehearse no residency at all.
    let system = HEAD.replace(
        "keys = 500",
        "keys = 500\ntable = \"_jobs\"\nfamily = \"j\"",
    );
    let err = drill("system.toml", &system).unwrap_err().to_string();
    assert!(
        err.contains("workload.table: \"_jobs\" is a system table"),
        "{err}"
    );

    // A backup: where it runs, with what, and that it runs to its end.
    let backup = format!(
        "{HEAD}\n[[faults]]\nat = \"1s\"\nkind = \"backup\"\nfor = \"1s\"\napp_profile = \"nobody\"\n\
         policies = [\"eu-resident\", \"mars\"]\ndeadline_ms = 0\n"
    );
    let err = drill("backup.toml", &backup).unwrap_err().to_string();
    for want in [
        "faults[0].for: a backup runs to its end",
        "faults[0].kind: backup needs the `region` it runs in",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }
    let backup = backup.replace("for = \"1s\"", "region = \"eu-west-1\"");
    let err = drill("backup.toml", &backup).unwrap_err().to_string();
    for want in [
        "faults[0].app_profile: no app profile \"nobody\" in the topology",
        "faults[0].policies[1]: no placement policy \"mars\"",
        "faults[0].deadline_ms: must be > 0",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }

    let waived = format!("{HEAD}\n[expect]\nzero_violations = false\n");
    let err = drill("waived.toml", &waived).unwrap_err().to_string();
    assert!(
        err.contains("expect.zero_violations: invariants cannot be waived"),
        "{err}"
    );
}

#[test]
fn same_seed_same_trace_other_seed_other_trace() -> Result<()> {
    let text = format!(
        "{HEAD}\n[[faults]]\nat = \"1s\"\nkind = \"lose-replica\"\nreplica = \"euw1-a\"\nfor = \"1s\"\n\n[[faults]]\nat = \"2s\"\nkind = \"partition\"\na = [\"asia\"]\nb = [\"europe\"]\nfor = \"1s\"\n"
    );
    let d = drill("determinism.toml", &text)?;
    let a = Simulation::new(d.scenario.clone())?.run()?;
    let b = Simulation::new(d.scenario.clone())?.run()?;
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(
        serde_json::to_value(&a.reads_by_mode)?,
        serde_json::to_value(&b.reads_by_mode)?
    );
    let mut other = d.scenario;
    other.seed += 1;
    let c = Simulation::new(other)?.run()?;
    assert_ne!(a.trace_hash, c.trace_hash);
    assert!(a.slo_failures.is_empty(), "{:?}", a.slo_failures);
    Ok(())
}

#[test]
fn every_fault_kind_keeps_the_invariants() -> Result<()> {
    let head = HEAD.replace("seed = 11", "seed = 11\nclock_skew_ms_max = 50");
    let text = format!(
        r#"{head}
[[faults]]
at = "500ms"
kind = "lose-region"
region = "eu-west-2"
for = "1500ms"

[[faults]]
at = "1s"
kind = "partition"
a = ["ap-northeast-1"]
b = ["north-america"]
one_way = true
for = "1s"

[[faults]]
at = "1s"
kind = "degrade-link"
a = ["us-east-1"]
b = ["europe"]
loss = 0.2
latency_ms = 30
bandwidth_mbps = 20
for = "2s"

[[faults]]
at = "1500ms"
kind = "pause-replica"
replica = "apse2-a"
for = "1s"

[[faults]]
at = "1s"
kind = "clock-skew"
replica = "usw2-a"
offset_ms = 300
for = "1s"

[[faults]]
at = "2s"
kind = "clock-jump"
replica = "euc1-a"
offset_ms = -200

[[faults]]
at = "1s"
kind = "change-placement"
placement = "sim/drills/apac-oregon.placement.toml"
rollout = "1s"

[[faults]]
at = "3s"
kind = "lose-replica"
replica = "aps1-relay"

[[faults]]
at = "2s"
kind = "crash-replica"
replica = "use2-a"
for = "1s"

[[faults]]
at = "1s"
kind = "slow-host"
region = "ap-southeast-1"
factor = 20
for = "2s"

[[faults]]
at = "1s"
kind = "migrate"
table = "ad_profiles"
prefix = "us/"
to = "eu-resident"

[[faults]]
at = "1500ms"
kind = "backup"
region = "eu-north-1"
deadline_ms = 1000
"#
    );
    let d = drill("all-faults.toml", &text)?;
    assert!(
        d.scenario
            .faults
            .iter()
            .any(|f| matches!(f.kind, FaultKind::ChangePlacement { .. }))
    );
    let r = Simulation::new(d.scenario)?.run()?;
    assert_eq!(r.faults.len(), 12);
    // The move ran (its runner, euc1-a, is the smallest id in both policies).
    assert_eq!(r.migrations.len(), 1, "{:?}", r.violations);
    assert_eq!(r.migrations[0].runner, "euc1-a");
    // The backup read every scope eu-north-1 may store, each as of its cut
    // (C10), apac's skipped (residency).
    assert_eq!(r.backups.len(), 1);
    let b = &r.backups[0];
    assert_eq!(
        b.scopes
            .iter()
            .map(|s| (s.scope.as_str(), s.state.as_str()))
            .collect::<Vec<_>>(),
        [("global", "done"), ("eu-resident", "done")],
        "{b:?}"
    );
    assert_eq!(b.skipped.len(), 1, "{b:?}");
    // Without change streams (topology/placement.toml), each row was checked
    // to lie between the writes up to the scope's start and up to its cut.
    assert!(
        b.scopes.iter().all(|s| !s.exact && s.rows_checked > 0),
        "{b:?}"
    );
    assert_eq!(r.lost_writes, 0, "{:?}", r.violations);
    assert_eq!(r.watermark_violations, 0, "{:?}", r.violations);
    assert_eq!(r.token_violations, 0, "{:?}", r.violations);
    assert_eq!(r.residency_leak_bytes, 0, "{:?}", r.violations);
    assert!(r.final_convergence_ms.is_some(), "{:?}", r.violations);
    assert!(r.slo_failures.is_empty(), "{:?}", r.slo_failures);
    // The faults did something: crashes restarted, the pause held frames, a
    // degraded lossy link delayed replication.
    assert!(
        r.replication_lag_ms.max > 500.0,
        "{:?}",
        r.replication_lag_ms
    );
    Ok(())
}

/// `[host]` costs show where they should: the request overhead in every read,
/// the fsync in write acknowledgements and replication lag (twice per hop: the
/// sender's turn and the receiver's), and nowhere else.
#[test]
fn host_costs_add_to_reads_writes_and_lag() -> Result<()> {
    let base = drill("host-base.toml", HEAD)?;
    let costly = drill(
        "host-costly.toml",
        &HEAD.replace(
            "[workload]",
            "[host]\noverhead_us = 3060\ncommit_us = 2300\ncommit_sigma = 0\n[workload]",
        ),
    )?;
    assert_eq!(costly.scenario.host.default.overhead_us, 3_060);
    assert_eq!(costly.scenario.host.default.commit_us, 2_300.0);
    let a = Simulation::new(base.scenario)?.run()?;
    let b = Simulation::new(costly.scenario)?.run()?;
    let (ea, eb) = (&a.reads_by_mode["eventual"], &b.reads_by_mode["eventual"]);
    assert!(
        eb.p50_ms >= ea.p50_ms + 2.8 && eb.p50_ms <= ea.p50_ms + 3.5,
        "eventual p50 {} -> {}",
        ea.p50_ms,
        eb.p50_ms
    );
    assert!(
        b.writes.p50_ms >= a.writes.p50_ms + 4.5,
        "write p50 {} -> {} (overhead + commit)",
        a.writes.p50_ms,
        b.writes.p50_ms
    );
    assert!(
        b.replication_lag_ms.p50 >= a.replication_lag_ms.p50 + 3.5,
        "lag p50 {} -> {}",
        a.replication_lag_ms.p50,
        b.replication_lag_ms.p50
    );
    for (bad, key) in [
        ("fsync_us = 1", "fsync_us"),
        ("cores = 0", "host.cores: must be 1 to 4096"),
        ("read_us = -1", "host.read_us: must be a finite number"),
        ("background = 1.5", "host.background: must be 0 to 0.9"),
        (
            "background_us = 0",
            "host.background_us: must be 1 to 1000000 µs",
        ),
        ("driver_wait = 0.5", "host.driver_wait: must be 1 to 40"),
        ("stall_per_s = -2", "host.stall_per_s: must be 0 to 1000"),
        ("stall_us = 0", "host.stall_us: must be 1 to 1000000 µs"),
        (
            "[host.regions.eu-west-1]\nmachine_cores = 2",
            "takes no regions, replicas, machine_cores or frontend_us",
        ),
        (
            "frontend_us = 80",
            "host.frontend_us: frontends take the replicas' CPU only on a shared machine",
        ),
        (
            "[host.regions.mars-1]\ncores = 2",
            "unknown region \"mars-1\"",
        ),
    ] {
        let err = drill(
            "host-bad.toml",
            &HEAD.replace("[workload]", &format!("[host]\n{bad}\n[workload]")),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains(key), "{bad}: {err}");
    }
    Ok(())
}

/// `[host] stall_per_s`: replicas' threads descheduled now and then give the
/// reads a far tail — their p99.9 grows well past the p50 — without the hosts
/// spending more CPU.
#[test]
fn descheduled_threads_give_reads_a_far_tail() -> Result<()> {
    let with = |host: &str| {
        HEAD.replace(
            "[workload]",
            &format!("[host]\ncpu_sigma = 0\n{host}[workload]"),
        )
    };
    let stalling = drill("stalls.toml", &with("stall_per_s = 20\nstall_us = 4000\n"))?;
    assert_eq!(stalling.scenario.host.default.stall_per_s, 20.0);
    assert_eq!(stalling.scenario.host.default.stall_us, 4_000.0);
    let a = Simulation::new(drill("steady.toml", &with(""))?.scenario)?.run()?;
    let b = Simulation::new(stalling.scenario)?.run()?;
    assert!(
        b.reads.p999_ms > a.reads.p999_ms + 2.0,
        "p99.9 {} -> {}",
        a.reads.p999_ms,
        b.reads.p999_ms
    );
    assert!(
        (b.reads.p50_ms - a.reads.p50_ms).abs() < 0.2,
        "p50 {} -> {}",
        a.reads.p50_ms,
        b.reads.p50_ms
    );
    let busy =
        |r: &pangea_sim::sim::metrics::RunReport| r.hosts.values().map(|h| h.cpu).sum::<f64>();
    assert!(
        (busy(&b) - busy(&a)).abs() < 0.02 * busy(&a),
        "cores busy {} -> {}",
        busy(&a),
        busy(&b)
    );
    Ok(())
}

/// Hosts are queues: given more reads than their cores serve, a region's replicas
/// fall behind and its reads miss their deadline, while the same load on a region
/// given bigger hosts (`[host.regions.*]`) is served within a few ms.
#[test]
fn frontends_on_the_replicas_machine_take_their_cores() -> Result<()> {
    // One 16-core machine: no queueing to speak of at 300 ops/s, so a frontend's
    // 400 µs for the request and 400 µs for the answer add about 0.8 ms to a read.
    let on = |frontend: &str| {
        HEAD.replace(
            "[workload]",
            &format!("[host]\nmachine_cores = 16\ncpu_sigma = 0\n{frontend}[workload]"),
        )
    };
    let a = Simulation::new(drill("machine.toml", &on(""))?.scenario)?.run()?;
    let fd = drill("frontends.toml", &on("frontend_us = 400\n"))?;
    let b = Simulation::new(fd.scenario.clone())?.run()?;
    let (ea, eb) = (&a.reads_by_mode["eventual"], &b.reads_by_mode["eventual"]);
    assert!(
        eb.p50_ms >= ea.p50_ms + 0.75 && eb.p50_ms <= ea.p50_ms + 0.9,
        "eventual p50 {} -> {}",
        ea.p50_ms,
        eb.p50_ms
    );
    // Their share of the machine is reported beside the replicas'.
    assert!(!a.hosts.contains_key(FRONTENDS));
    let share = b.hosts[FRONTENDS].cpu;
    // About 300 ops/s × 2 × 400 µs of 16 cores (more for hedges and failovers).
    assert!((0.014..0.03).contains(&share), "frontends' share {share}");
    // They are busier than any replica, but the terminal summary's busiest host
    // is a replica's.
    assert!(
        b.hosts
            .iter()
            .all(|(id, h)| id == FRONTENDS || h.cpu < share)
    );
    let screen = pangea_sim::runner::one_screen(&pangea_sim::runner::DrillRun {
        drill: fd,
        report: b,
    });
    let busiest = screen
        .lines()
        .find(|l| l.contains("busiest host"))
        .expect("a busiest host line");
    assert!(!busiest.contains(FRONTENDS), "{busiest}");
    Ok(())
}

/// A frontend busy with an answer that came in does not fire the read's hedge
/// timer first (the library's loop takes answers before timers): with 3 ms of a
/// frontend's CPU on each side of a read and a 5 ms hedge timer (half the 10 ms
/// deadline), every answer reaches its frontend before the timer and is done
/// after it, and no read hedges. At 6 ms a side the answers come after the timer,
/// which does hedge.
#[test]
fn a_hedge_timer_does_not_overtake_an_answer_its_frontend_holds() -> Result<()> {
    let run = |frontend_us: u32| -> Result<pangea_sim::sim::metrics::RunReport> {
        let text = HEAD
            .replace(
                "[workload]",
                &format!(
                    "[host]\nmachine_cores = 16\ncpu_sigma = 0\nfrontend_us = {frontend_us}\n[workload]\ndeadline_ms = 10"
                ),
            )
            .replace("local_fraction = 0.6", "local_fraction = 1.0")
            .replace(
                "modes = { eventual = 0.4, affinity = 0.2, watermark = 0.3, bounded = 0.1 }",
                "modes = { eventual = 1.0, affinity = 0.0, watermark = 0.0, bounded = 0.0 }",
            )
            .replace(
                "mix = { read = 0.8, write = 0.17, delete = 0.03 }",
                "mix = { read = 1.0, write = 0.0, delete = 0.0 }",
            );
        Simulation::new(drill("hedge-timer.toml", &text)?.scenario)?.run()
    };
    let held = run(3_000)?;
    let reads = &held.reads_by_mode["eventual"];
    assert!(reads.count > 500 && reads.errors == 0, "{reads:?}");
    assert!(
        reads.p50_ms >= 6.0,
        "answers done after the timer: {reads:?}"
    );
    assert_eq!(held.counters.hedges, 0);
    let late = run(6_000)?;
    assert!(late.counters.hedges > 0, "answers after the timer hedge");
    Ok(())
}

#[test]
fn a_host_saturates_and_a_bigger_one_does_not() -> Result<()> {
    // 1 ms a read on 2 cores: 2,000 reads/s a replica. Two regions, each with two
    // replicas, get 6,000 reads/s each: 1.5× what their hosts serve, unless they
    // have 8 cores.
    let text = HEAD.replace("rate = 300", "rate = 0").replace(
        "[workload]",
        "[host]\nread_us = 1000\ncpu_sigma = 0.3\n[host.regions.eu-west-2]\ncores = 8\n[workload]",
    ) + r#"mix = { read = 1.0, write = 0.0, delete = 0.0 }
local_fraction = 1.0
modes = { eventual = 1.0, affinity = 0.0, watermark = 0.0, bounded = 0.0 }
[[workload.regions]]
region = "eu-west-2"
clients = 4
rate = 6000
[[workload.regions]]
region = "eu-central-1"
clients = 4
rate = 6000
[expect]
region_p99_ms_max = 20
"#;
    let text = text.replacen("mix = { read = 0.8, write = 0.17, delete = 0.03 }\n", "", 1);
    let text = text.replacen(
        "modes = { eventual = 0.4, affinity = 0.2, watermark = 0.3, bounded = 0.1 }\n",
        "",
        1,
    );
    let text = text.replacen("local_fraction = 0.6\n", "", 1);
    let d = drill("saturated.toml", &text)?;
    let r = Simulation::new(d.scenario)?.run()?;
    let big = &r.reads_by_region["eu-west-2"];
    let small = &r.reads_by_region["eu-central-1"];
    assert!(big.errors * 1000 <= big.count, "bigger hosts: {big:?}");
    assert!(big.p99_ms < 10.0, "bigger hosts: {big:?}");
    // Saturated: reads queue up to the deadline, and the hedges and failovers to
    // other regions cannot take all of them.
    assert!(
        small.errors * 20 > small.count || small.p99_ms > 15.0,
        "saturated hosts kept up: {small:?}"
    );
    // The per-region SLO names the saturated region and only it.
    let failed = |region: &str| {
        r.slo_failures
            .iter()
            .any(|f| f.contains(&format!("reads in {region} ")))
    };
    assert!(
        !failed("eu-west-2") && (failed("eu-central-1") || small.errors > 0),
        "{:?}",
        r.slo_failures
    );
    Ok(())
}

/// A crashed process is refused at once: its region's frontends fail over after
/// one round trip. A lost host is silent: they find out by hedges, deadlines and
/// probes, and reads that asked only silent replicas fail.
#[test]
fn a_lost_host_is_silent_and_a_crashed_process_refuses() -> Result<()> {
    let run = |kind: &str| -> Result<pangea_sim::sim::metrics::RunReport> {
        let text = HEAD.replace("duration = \"4s\"", "duration = \"6s\"")
            + &format!(
                "[[faults]]\nat = \"2s\"\nkind = \"{kind}\"\nreplicas = [\"euw2-a\", \"euw2-b\"]\nfor = \"3s\"\n"
            );
        let d = drill(&format!("{kind}.toml"), &text)?;
        Simulation::new(d.scenario)?.run()
    };
    let crashed = run("crash-replica")?;
    let lost = run("lose-replica")?;
    for r in [&crashed, &lost] {
        assert_eq!(r.lost_writes, 0, "{:?}", r.violations);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
    }
    let (c, l) = (
        &crashed.reads_by_region["eu-west-2"],
        &lost.reads_by_region["eu-west-2"],
    );
    // Refused: every read fails over in time. Silent: reads that asked both local
    // replicas (the first, then a hedge) run into their deadline until probes
    // mark the replicas unreachable.
    assert_eq!(c.errors, 0, "crashed: {c:?}");
    assert!(
        l.errors > c.errors,
        "silence should cost more than a refusal: lost {l:?}, crashed {c:?}"
    );
    Ok(())
}

/// Tree changes leave no mesh behind: a replica forwards to the members whose own
/// heartbeats say they hold it as a tree neighbour, so once a failure heals every
/// entry goes out about once per replica that applies it again. (When any traffic
/// made a sender an "inbound neighbour", two replicas kept each other inbound for
/// ever by forwarding to each other: every tree a failure made left its edges
/// behind, and after the `rolling-restart` drill each entry went out about 15 times
/// per apply.) Two runs with the same early failure, 12 s and 24 s long: the
/// seconds only the longer one has must cost about one send per apply.
#[test]
fn failures_leave_no_mesh_behind() -> Result<()> {
    let run = |secs: u64| -> Result<(f64, f64, u64)> {
        let text = format!(
            "{}\n[[faults]]\nat = \"1s\"\nkind = \"lose-replica\"\nreplica = \"euw1-a\"\nfor = \"2s\"\n",
            HEAD.replace("duration = \"4s\"", &format!("duration = \"{secs}s\""))
        );
        let r = Simulation::new(drill("failure.toml", &text)?.scenario)?.run()?;
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        let sent = r.counters.frames_sent["mutations"].items as f64;
        Ok((
            sent,
            r.counters.entries_applied as f64,
            r.counters.peer_suspicions,
        ))
    };
    let (sent_short, applied_short, _) = run(12)?;
    let (sent_long, applied_long, suspicions) = run(24)?;
    // The other 26 suspect the lost replica (and some, briefly, a peer heard only
    // through it); suspecting every quiet peer at once made it about 340.
    assert!(
        suspicions < 80,
        "{suspicions} suspicions for one lost replica"
    );
    let tail = (sent_long - sent_short) / (applied_long - applied_short);
    eprintln!("{tail:.2} mutations sent per entry applied after the failure");
    assert!(
        tail < 1.2,
        "{tail:.2} mutations sent per entry applied, long after the failure healed"
    );
    Ok(())
}

/// A capacity search finds where a region's SLO breaks, and less of it without
/// one of the region's replicas.
#[test]
fn capacity_is_found_and_shrinks_without_a_replica() -> Result<()> {
    use pangea_sim::capacity::{Query, search};
    // 1 ms a read on 2 cores: about 2,000 reads/s a replica, eu-west-2 has two.
    let text = HEAD.replace(
        "[workload]",
        "[host]\nread_us = 1000\ncpu_sigma = 0.3\n[workload]",
    );
    let d = drill("capacity.toml", &text)?;
    let query = |without: &[&str]| Query {
        region: "eu-west-2".into(),
        without: without.iter().map(|r| (*r).into()).collect(),
        seconds: 1,
        warmup: pangea_sim::capacity::WARMUP_S,
        fill: false,
        slo_ms: 20.0,
        from: Some(1_000.0),
        bisect: 2,
        threads: 1,
    };
    let both = search(&d.scenario, &query(&[]), |_| {})?;
    let one = search(&d.scenario, &query(&["euw2-a"]), |_| {})?;
    let (Some(c2), Some(c1)) = (both.capacity, one.capacity) else {
        panic!("no capacity found: {both:?} {one:?}");
    };
    // Reads are most of the mix and most go to the region's own replicas, so the
    // capacity is near what their cores serve (and hedges and failovers to other
    // regions take some of the rest).
    assert!((2_000.0..8_000.0).contains(&c2), "{both:#?}");
    assert!(c1 < c2 * 0.8, "without euw2-a {c1}, with it {c2}");
    assert!(both.first_miss.is_some_and(|m| m > c2));
    // Each step's verdict is what its figures say.
    for s in both.steps.iter().chain(&one.steps) {
        let p99_ok = s.p99_ms.values().all(|p| *p <= 20.0);
        assert_eq!(s.met_slo, p99_ok && s.errors * 1000 <= s.reads, "{s:?}");
    }
    let err = search(&d.scenario, &query(&["euc1-a"]), |_| {}).unwrap_err();
    assert!(err.to_string().contains("not in eu-west-2"), "{err}");
    Ok(())
}
