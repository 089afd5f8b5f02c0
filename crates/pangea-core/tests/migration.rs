//! Placement migration jobs (`pangea_core::migration::Job`) stepped on in-memory
//! replicas of the local three-region deployment, frames moved by hand, time
//! passed in: the job moves `us/` rows from `global` to `eu-resident` (a narrowing
//! the placement file allows), through a restart of its runner, and refuses the
//! moves it must refuse.

use bytes::Bytes;
use pangea_core::migration::{Job, Progress, Refused, Request, resumable};
use pangea_core::replica::{Now, Replica};
use pangea_core::storage::Storage;
use pangea_core::{Limits, MemStorage, Mutation, RowMutation, ScopeId};
use pangea_topology::Deployment;
use std::collections::BTreeMap;
use std::sync::Arc;

mod common;
use common::{at, deployment, pump, replica};

type Cluster = BTreeMap<String, Replica<MemStorage>>;

const RUNNER: &str = "euw1-a";

fn cluster(d: &Arc<Deployment>) -> Cluster {
    d.topology
        .replicas
        .keys()
        .map(|id| (id.to_string(), replica(d, id.as_str())))
        .collect()
}

fn set(key: &str) -> RowMutation {
    let m = Mutation::SetCell {
        family: "profile".into(),
        column: Bytes::from_static(b"p"),
        value: Bytes::from(format!("value of {key}")),
    };
    RowMutation::new("ad_profiles", key.to_owned(), vec![m], &Limits::default()).unwrap()
}

fn move_us(to: &str) -> Request {
    Request {
        table: "ad_profiles".into(),
        prefix: Bytes::from_static(b"us/"),
        to: to.into(),
        home: String::new(),
    }
}

fn rows(r: &Replica<MemStorage>, prefix: &[u8]) -> usize {
    r.storage()
        .scan_rows("ad_profiles", prefix, None, usize::MAX)
        .unwrap()
        .len()
}

/// One millisecond of the cluster: due timers, the job's step (when given), every
/// flush, every frame delivered, and the purges a flip allows.
fn tick(c: &mut Cluster, job: Option<&mut Job>, now: Now) -> Option<Progress> {
    for r in c.values_mut() {
        if r.poll_timeout().is_some_and(|t| t <= now.mono_us) {
            r.handle_timeout(now).unwrap();
        }
    }
    let progress = job.map(|j| j.step(c.get_mut(RUNNER).unwrap(), now).unwrap());
    pump(c, now);
    for r in c.values_mut() {
        r.purge_moved_rows().unwrap();
        while r.poll_event().is_some() {}
    }
    progress
}

/// Steps `job` from `from_ms` until it finishes; returns the time it did.
fn run_to_end(c: &mut Cluster, job: &mut Job, from_ms: u64) -> u64 {
    for ms in from_ms..from_ms + 60_000 {
        if tick(c, Some(job), at(ms)) == Some(Progress::Finished) {
            return ms;
        }
    }
    panic!("job {} still at {:?} after 60 s", job.id(), job.record());
}

/// A cluster holding `n` rows under `us/`, written at use1-a and everywhere.
fn loaded(n: usize) -> (Arc<Deployment>, Cluster) {
    let d = deployment();
    let mut c = cluster(&d);
    for i in 0..n {
        c.get_mut("use1-a")
            .unwrap()
            .propose(at(0), set(&format!("us/{i:04}")))
            .unwrap();
    }
    for ms in 0..1_000 {
        tick(&mut c, None, at(ms));
    }
    assert!(
        c.values()
            .all(|r| rows(r, b"us/") == n || r.id().as_str() == "use1-batch")
    );
    (d, c)
}

#[test]
fn a_job_moves_rows_to_the_new_policy_and_they_leave_the_others() {
    let (d, mut c) = loaded(250);
    let mut job = Job::plan(&c[RUNNER], &d, move_us("eu-resident"), at(1_000)).unwrap();
    // A write while the rows migrate, taken by a replica of both policies: it
    // reaches the new policy by the dual write, not the backfill.
    let mut wrote_during = false;
    let mut end = None;
    for ms in 1_000..61_000 {
        if !wrote_during && job.record().phase == "backfill" {
            c.get_mut("euw1-b")
                .unwrap()
                .propose(at(ms), set("us/written-during"))
                .unwrap();
            wrote_during = true;
        }
        if tick(&mut c, Some(&mut job), at(ms)) == Some(Progress::Finished) {
            end = Some(ms);
            break;
        }
    }
    assert!(end.is_some(), "job stuck at {:?}", job.record());
    assert!(wrote_during);
    let r = job.record();
    assert_eq!(r.phase, "done", "{r:?}");
    // Counted before the write; copied too (it sorts after the first batch), which
    // is harmless: the copy merges with the dual write's own versions.
    assert_eq!((r.rows_total, r.rows_copied), (250, 251));
    let eu = ScopeId::from("eu-resident");
    for (id, rep) in &c {
        assert_eq!(rep.scope_of("ad_profiles", b"us/0001"), eu, "{id}");
        let expected = if id.starts_with("euw1") { 251 } else { 0 };
        assert_eq!(rows(rep, b"us/"), expected, "{id}");
    }
    // The job is recorded done: nothing to resume.
    assert!(resumable(&c[RUNNER]).unwrap().is_empty());
}

#[test]
fn a_job_resumes_from_its_checkpoint_after_its_runner_restarts() {
    let (d, mut c) = loaded(250);
    let mut job = Job::plan(&c[RUNNER], &d, move_us("eu-resident"), at(1_000)).unwrap();
    let mut ms = 1_000;
    // Until the first backfill batch is checkpointed.
    while !(job.record().phase == "backfill" && job.record().rows_copied > 0) {
        tick(&mut c, Some(&mut job), at(ms));
        ms += 1;
        assert!(ms < 30_000, "no backfill: {:?}", job.record());
    }
    tick(&mut c, None, at(ms));
    // The runner's process goes; its store (and the checkpoint in it) stays.
    drop(job);
    let mut resumed = resumable(&c[RUNNER]).unwrap();
    assert_eq!(resumed.len(), 1);
    let mut job = resumed.pop().unwrap();
    assert_eq!(job.record().phase, "backfill");
    assert!(job.record().rows_copied >= 100);
    run_to_end(&mut c, &mut job, ms + 1);
    assert_eq!(job.record().phase, "done");
    for (id, rep) in &c {
        let expected = if id.starts_with("euw1") { 250 } else { 0 };
        assert_eq!(rows(rep, b"us/"), expected, "{id}");
    }
}

#[test]
fn a_job_waits_for_a_replica_that_is_down_and_finishes_when_it_is_back() {
    let (d, mut c) = loaded(20);
    let mut job = Job::plan(&c[RUNNER], &d, move_us("eu-resident"), at(1_000)).unwrap();
    // apne1-b is down from the start: nothing reaches it, it reports nothing.
    let down = c.remove("apne1-b").unwrap();
    for ms in 1_000..11_000 {
        assert_ne!(
            tick(&mut c, Some(&mut job), at(ms)),
            Some(Progress::Finished)
        );
    }
    // It waits on the dual-write entry reaching apne1-b; nothing moved yet.
    assert_eq!(job.record().phase, "planned");
    assert_eq!(rows(&c["use1-a"], b"us/"), 20);
    c.insert("apne1-b".into(), down);
    run_to_end(&mut c, &mut job, 11_000);
    assert_eq!(job.record().phase, "done");
    assert_eq!(rows(&c["apne1-b"], b"us/"), 0);
}

#[test]
fn moves_that_would_widen_residency_or_run_outside_a_policy_are_refused() {
    let (d, c) = loaded(0);
    let widen = Request {
        prefix: Bytes::from_static(b"eu/"),
        ..move_us("global")
    };
    assert!(matches!(
        Job::plan(&c[RUNNER], &d, widen, at(0)),
        Err(Refused::EscapesResidency { .. })
    ));
    assert!(matches!(
        Job::plan(&c["use1-a"], &d, move_us("eu-resident"), at(0)),
        Err(Refused::RunnerOutside { .. })
    ));
    assert!(matches!(
        Job::plan(&c[RUNNER], &d, move_us("global"), at(0)),
        Err(Refused::AlreadyThere { .. })
    ));
    assert!(matches!(
        Job::plan(&c[RUNNER], &d, move_us("nowhere"), at(0)),
        Err(Refused::UnknownPolicy(_))
    ));
}

/// The local deployment with rows in 8 shard groups and every serving replica
/// running 2 processes (groups 0–3 and 4–7; the batch replica one).
fn sharded() -> Arc<Deployment> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topology");
    let (t, p) = (
        root.join("local-3-regions.toml"),
        root.join("local-3-regions.placement.toml"),
    );
    let text = std::fs::read_to_string(&t)
        .unwrap()
        .replace(
            "intra_region_rtt_ms = 1.0",
            "intra_region_rtt_ms = 1.0\nshard_groups = 8",
        )
        .replace(
            "role = \"serving\"",
            "role = \"serving\"\n    processes = 2",
        );
    let placement = std::fs::read_to_string(&p).unwrap();
    Arc::new(Deployment::parse(&t, &text, Some((&p, &placement))).unwrap())
}

/// Every process's jobs, by process id.
type Jobs = BTreeMap<String, Vec<Job>>;

/// One millisecond of a cluster running `jobs`: parts handed to their processes
/// start (as the node's driver starts them), every job steps on its process, and
/// finished ones move to `done`.
fn tick_jobs(c: &mut Cluster, jobs: &mut Jobs, done: &mut Vec<Job>, now: Now) {
    for (id, r) in c.iter_mut() {
        if r.poll_timeout().is_some_and(|t| t <= now.mono_us) {
            r.handle_timeout(now).unwrap();
        }
        for record in r.take_assigned_jobs() {
            let mine = jobs.entry(id.clone()).or_default();
            if !mine.iter().any(|j| j.id() == record.id) {
                mine.push(Job::resumed(record));
            }
        }
    }
    for (id, mine) in jobs.iter_mut() {
        let r = c.get_mut(id).unwrap();
        let mut k = 0;
        while k < mine.len() {
            if mine[k].step(r, now).unwrap() == Progress::Finished {
                done.push(mine.swap_remove(k));
            } else {
                k += 1;
            }
        }
    }
    pump(c, now);
    for r in c.values_mut() {
        r.purge_moved_rows().unwrap();
        while r.poll_event().is_some() {}
    }
}

/// The process of replica `of` that serves `key`'s row where it lives now.
fn serving<'a>(c: &'a mut Cluster, of: &str, key: &[u8]) -> &'a mut Replica<MemStorage> {
    c.values_mut()
        .find(|r| {
            r.id().as_str().split('.').next() == Some(of)
                && r.belongs_to(&r.scope_of("ad_profiles", key))
        })
        .unwrap()
}

#[test]
fn a_job_on_replicas_of_many_processes_moves_every_groups_rows() {
    let d = sharded();
    assert!(d.topology.replicas.contains_key("euw1-a.p1"));
    let mut c = cluster(&d);
    const N: usize = 400;
    for i in 0..N {
        let key = format!("us/{i:04}");
        serving(&mut c, "use1-a", key.as_bytes())
            .propose(at(0), set(&key))
            .unwrap();
    }
    let (mut jobs, mut done) = (Jobs::new(), Vec::new());
    for ms in 0..1_000 {
        tick_jobs(&mut c, &mut jobs, &mut done, at(ms));
    }
    // Every process holds the rows of its groups (and all of the global
    // policy's group 0, which every process hosts).
    let held = |c: &Cluster, of: &str| -> usize {
        let mut keys: Vec<_> = c
            .iter()
            .filter(|(id, _)| id.split('.').next() == Some(of))
            .flat_map(|(_, r)| {
                r.storage()
                    .scan_rows("ad_profiles", b"us/", None, usize::MAX)
                    .unwrap()
            })
            .map(|(k, _)| k)
            .collect();
        keys.sort();
        keys.dedup();
        keys.len()
    };
    assert_eq!(held(&c, "apne1-b"), N);

    let job = Job::plan(&c[RUNNER], &d, move_us("eu-resident"), at(1_000)).unwrap();
    jobs.entry(RUNNER.into()).or_default().push(job);
    let (mut wrote_during, mut restarted) = (false, false);
    let mut ms = 1_000;
    while done.iter().all(|j| !j.record().part_of.is_empty()) {
        // A write while the rows migrate, taken by the process of a replica of
        // both policies that serves its group: the dual write carries it.
        let backfilling = jobs
            .values()
            .flatten()
            .any(|j| j.record().phase == "backfill");
        if !wrote_during && backfilling {
            serving(&mut c, "euw1-b", b"us/written-during")
                .propose(at(ms), set("us/written-during"))
                .unwrap();
            wrote_during = true;
        }
        // The part on process 1 of the runner's replica restarts mid-backfill:
        // it resumes from its own checkpoint.
        let part = format!("{RUNNER}.p1");
        if !restarted
            && jobs
                .get(&part)
                .is_some_and(|js| js.iter().any(|j| j.record().rows_copied > 0))
        {
            jobs.remove(&part);
            let resumed = resumable(&c[&part]).unwrap();
            assert_eq!(resumed.len(), 1, "the part's checkpoint");
            assert_eq!(resumed[0].record().part_of, jobs[RUNNER][0].id());
            jobs.insert(part, resumed);
            restarted = true;
        }
        tick_jobs(&mut c, &mut jobs, &mut done, at(ms));
        ms += 1;
        assert!(
            ms < 61_000,
            "stuck: {:?}",
            jobs.values()
                .flatten()
                .map(|j| j.record())
                .collect::<Vec<_>>()
        );
    }
    assert!(wrote_during && restarted);
    let job = done.iter().find(|j| j.record().part_of.is_empty()).unwrap();
    let r = job.record();
    assert_eq!(r.phase, "done", "{r:?}");
    assert_eq!(r.parts, 2);
    // Counted and copied by both processes (the write made during the move may
    // be copied too: its copy merges with the dual write's versions).
    assert_eq!(r.rows_total, N as u64);
    assert!((N as u64..=N as u64 + 1).contains(&r.rows_copied), "{r:?}");
    let part = done
        .iter()
        .find(|j| !j.record().part_of.is_empty())
        .unwrap();
    assert_eq!(part.record().phase, "done");
    assert!(part.record().rows_copied > 0);

    let eu = ScopeId::from("eu-resident");
    for (id, rep) in &c {
        assert_eq!(
            rep.scope_of("ad_profiles", b"us/0001").policy(),
            eu.as_str(),
            "{id}"
        );
        let rows = rep
            .storage()
            .scan_rows("ad_profiles", b"us/", None, usize::MAX)
            .unwrap();
        if !id.starts_with("euw1") {
            assert!(rows.is_empty(), "{id} keeps {} rows", rows.len());
        }
        // Each process holds only the rows of the groups it serves now.
        for (key, _) in rows {
            assert!(
                rep.belongs_to(&rep.scope_of("ad_profiles", &key)),
                "{id} holds {key:?}"
            );
        }
    }
    for of in ["euw1-a", "euw1-b"] {
        assert_eq!(held(&c, of), N + 1, "{of}");
    }
    assert!(resumable(&c[RUNNER]).unwrap().is_empty());
}
