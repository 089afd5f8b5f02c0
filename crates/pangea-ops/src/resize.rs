//! Resizing a replica of a running local cluster (`pangea cluster resize`):
//! adding processes to it or draining some, moving shard groups between its
//! processes under load with no downtime and no write lost (docs/sharding.md,
//! "Resizing a replica").
//!
//! The mover drives the replica through the steps `Deployment::layout_changes`
//! allows, each an ordinary apply of the topology file (new processes started,
//! every process reloading, drained ones stopped), and waits between them on
//! what the processes report in `/watermarks`:
//!
//! 1. **copy**: the file says `resize_from = P`, `resize_phase = "copy"`. The old
//!    layout serves; each group whose host changes is held by its new host too,
//!    a leaf of the tree under the old host, which fills it (snapshot or gap
//!    repair, then the stream). The mover waits until every new host has
//!    applied, per origin, what its old host had.
//! 2. **serve**: the new layout serves (clients follow the announced files; a
//!    process refusing a row names its host, and the client re-plans). The old
//!    hosts follow under the new ones, answer reads of clients not yet
//!    following, and refuse writes. The mover waits until every member of each
//!    moved group — here and in every other replica — has applied all of the
//!    old host's own stream there, so its tokens stay covered everywhere
//!    (`pangea_core::read::retired_origin`).
//! 3. **finish**: `processes` alone. Old hosts leave the moved groups and purge
//!    their rows; drained processes stop.
//!
//! The cluster's topology file is the mover's only state: run again after a
//! kill, it takes up the step the file names. (A kill during an apply itself is
//! an apply's failure: see docs/operations.md, "Safe applies".)

use crate::admin::Admin;
use crate::apply::Apply;
use crate::local;
use anyhow::{Context, Result};
use pangea_topology::cluster::{ClusterFile, ClusterReplica};
use pangea_topology::shard::{GroupId, process_of};
use pangea_topology::{Deployment, ResizePhase, ScopeId, process_id};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What to resize (`pangea cluster resize` flags).
#[derive(Debug, Clone)]
pub struct Options {
    /// The cluster file (`pangea cluster up` writes DIR/cluster.toml).
    pub cluster: PathBuf,
    /// The replica (its id in the topology file).
    pub replica: String,
    /// The number of processes it should run.
    pub processes: u32,
    /// The `pangea` binary new processes run.
    pub binary: PathBuf,
    /// Longest wait for each of the copy and drain steps.
    pub step_limit: Duration,
    /// Least time the serve step lasts: clients take up announced files within
    /// about a second (`pangea-client`'s background refresh).
    pub serve_min: Duration,
}

/// How often the mover looks at the processes' watermarks.
const POLL: Duration = Duration::from_millis(200);

/// Resizes the replica, from whatever step the cluster's topology file is at;
/// progress lines go to `say`.
pub fn run(o: &Options, say: &mut dyn FnMut(&str)) -> Result<()> {
    let d = deployment(&o.cluster)?;
    let r = d
        .topology
        .replica(&o.replica)
        .filter(|r| r.index == 0)
        .with_context(|| format!("the topology has no replica {:?}", o.replica))?;
    let groups = d.topology.shard_groups;
    anyhow::ensure!(
        (1..=groups).contains(&o.processes),
        "--processes must be 1 ..= shard_groups ({groups}): each process hosts a group at \
         least, got {}",
        o.processes
    );
    match r.resize {
        None if r.processes == o.processes => {
            say(&format!(
                "replica {} already runs {} processes",
                o.replica, o.processes
            ));
            return Ok(());
        }
        None => {
            let moves = unfinished_moves(&running_moves(&o.cluster)?, &o.replica);
            anyhow::ensure!(
                moves.is_empty(),
                "replica {} runs placement moves ({}): a resize would move the shard groups \
                 their parts copy from under them. Let them finish (pangea placement \
                 status) and resize after",
                o.replica,
                moves.join(", ")
            );
            say(&format!(
                "replica {}: {} -> {} processes; step 1/3, copy",
                o.replica, r.processes, o.processes
            ));
            step(o, Some((r.processes, ResizePhase::Copy)), say)?;
        }
        Some(z) if r.processes != o.processes => anyhow::bail!(
            "replica {} is being resized from {} to {} processes: finish that first \
             (pangea cluster resize --processes {})",
            o.replica,
            z.from,
            r.processes,
            r.processes
        ),
        Some(z) => {
            say(&format!(
                "replica {}: resuming the resize from {} to {} processes at its {} step",
                o.replica,
                z.from,
                r.processes,
                z.phase.name()
            ));
            resume(o, say)?;
        }
    }
    let d = deployment(&o.cluster)?;
    let r = d.topology.replica(&o.replica).context("replica gone")?;
    let from = r
        .resize
        .context("the resize is no longer in the file")?
        .from;
    let moving = moving_scopes(&d, &o.replica, from, o.processes);
    if r.resize.is_some_and(|z| z.phase == ResizePhase::Copy) {
        wait_copied(o, &moving, say)?;
        say(&format!(
            "replica {}: step 2/3, serve (the new layout serves)",
            o.replica
        ));
        step(o, Some((from, ResizePhase::Serve)), say)?;
    }
    wait_drained(o, &moving, say)?;
    say(&format!(
        "replica {}: step 3/3, finish ({} processes)",
        o.replica, o.processes
    ));
    step(o, None, say)?;
    say(&format!(
        "replica {} runs {} processes",
        o.replica, o.processes
    ));
    Ok(())
}

/// Every placement move job of the cluster (`_jobs`, read as its operator).
fn running_moves(cluster: &Path) -> Result<Vec<pangea_proto::v1::MigrationJob>> {
    let c = ClusterFile::load(cluster).map_err(anyhow::Error::msg)?;
    let region = c
        .replicas
        .first()
        .map(|r| r.region.clone())
        .context("the cluster file lists no replica")?;
    let config = local::operator_config(&c, &region)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = pangea_client::Client::connect(config).await?;
        Ok(client.jobs().await?)
    })
}

/// The ids and phases of the `jobs` not yet done or failed that run on
/// `replica` (the job on its process 0, parts on the others): a resize waits for
/// them.
fn unfinished_moves(jobs: &[pangea_proto::v1::MigrationJob], replica: &str) -> Vec<String> {
    let on_replica = |runner: &str| {
        runner == replica
            || runner
                .strip_prefix(replica)
                .is_some_and(|rest| rest.starts_with(".p"))
    };
    jobs.iter()
        .filter(|j| !matches!(j.phase.as_str(), "done" | "failed") && on_replica(&j.runner))
        .map(|j| format!("{} ({})", j.id, j.phase))
        .collect()
}

fn deployment(cluster: &Path) -> Result<Deployment> {
    let c = ClusterFile::load(cluster).map_err(anyhow::Error::msg)?;
    local::load(&c.topology, c.placement.as_deref())
}

/// A group scope whose host in the replica changes: from process `old` to `new`.
#[derive(Debug, Clone)]
struct Moving {
    scope: ScopeId,
    old: String,
    new: String,
    /// Whether `old` stops taking writes of the scope (it leaves it), so that
    /// its stream there must reach every member before the finish: all but the
    /// system scope joined by an added process, where `old` is process 0.
    drains: bool,
}

/// The group scopes of the replica's policies whose host changes from `from`
/// processes to `to`, and the system scope of each process added or drained.
fn moving_scopes(d: &Deployment, replica: &str, from: u32, to: u32) -> Vec<Moving> {
    let Some(r) = d.topology.replica(replica) else {
        return Vec::new();
    };
    let groups = d.topology.shard_groups;
    // The system scope is on every process: a process added joins it, one
    // drained leaves it (its stream there must reach everyone first).
    let system = (from.min(to)..from.max(to)).map(|index| Moving {
        scope: d.system_scope().clone(),
        old: process_id(replica, if from > to { index } else { 0 }).to_string(),
        new: process_id(replica, if from > to { 0 } else { index }).to_string(),
        drains: from > to,
    });
    d.scopes()
        .filter(|s| *s != d.system_scope())
        .filter(|s| {
            d.placement
                .policy(s)
                .is_some_and(|p| p.regions.contains(&r.region))
        })
        .filter_map(|s| {
            let g = s.group().unwrap_or(GroupId(0));
            let (old, new) = (process_of(groups, from, g), process_of(groups, to, g));
            (old != new).then(|| Moving {
                scope: s.clone(),
                old: process_id(replica, old).to_string(),
                new: process_id(replica, new).to_string(),
                drains: true,
            })
        })
        .chain(system)
        .collect()
}

/// Writes the cluster's topology with the replica at `processes` and `resize`
/// (`None`: no resize) and applies it.
fn step(o: &Options, resize: Option<(u32, ResizePhase)>, say: &mut dyn FnMut(&str)) -> Result<()> {
    let cluster = ClusterFile::load(&o.cluster).map_err(anyhow::Error::msg)?;
    let text = std::fs::read_to_string(&cluster.topology)
        .with_context(|| format!("reading {}", cluster.topology.display()))?;
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .with_context(|| format!("parsing {}", cluster.topology.display()))?;
    let mut found = false;
    local::for_each_replica(&mut doc, |rep| {
        if rep.get("id").and_then(|v| v.as_str()) != Some(o.replica.as_str()) {
            return;
        }
        found = true;
        rep["processes"] = toml_edit::value(i64::from(o.processes));
        match resize {
            Some((from, phase)) => {
                rep["resize_from"] = toml_edit::value(i64::from(from));
                rep["resize_phase"] = toml_edit::value(phase.name());
            }
            None => {
                rep.remove("resize_from");
                rep.remove("resize_phase");
            }
        }
    });
    anyhow::ensure!(
        found,
        "replica {:?} is not in {}",
        o.replica,
        cluster.topology.display()
    );
    let tmp = tempfile::tempdir()?;
    let next = tmp.path().join("topology.toml");
    std::fs::write(&next, doc.to_string())?;
    apply(o, &next, say)
}

/// Applies `topology` to the cluster (its placement unchanged).
fn apply(o: &Options, topology: &Path, say: &mut dyn FnMut(&str)) -> Result<()> {
    let a = Apply::prepare(&o.cluster, topology, None)?;
    let refused = a.refused(|_| false);
    anyhow::ensure!(
        refused.is_empty(),
        "the resize would make destructive changes: {}",
        refused.join("; ")
    );
    let mut indented = |line: &str| say(&format!("  {line}"));
    a.run(&o.binary, &mut indented)?;
    Ok(())
}

/// After a kill of the mover: starts the cluster's processes that are down and
/// has every process re-read the files the cluster's topology file now says.
fn resume(o: &Options, say: &mut dyn FnMut(&str)) -> Result<()> {
    let cluster = ClusterFile::load(&o.cluster).map_err(anyhow::Error::msg)?;
    for r in &cluster.replicas {
        if !r.pid.is_some_and(local::alive) {
            local::restart_replica(&o.binary, &o.cluster, &r.id)?;
            say(&format!("  restarted {}", r.id));
        }
    }
    let current = tempfile::tempdir()?;
    let topology = current.path().join("topology.toml");
    std::fs::copy(&cluster.topology, &topology)?;
    apply(o, &topology, say)
}

/// Per scope and origin, the sequence a process has applied (its /watermarks);
/// `None` while it does not answer.
pub(crate) fn marks(r: &ClusterReplica) -> Option<BTreeMap<String, BTreeMap<String, u64>>> {
    let w = Admin::new(&r.admin).ok()?.watermarks().ok()?;
    Some(
        w.scopes
            .into_iter()
            .map(|s| {
                let origins = s
                    .origins
                    .into_iter()
                    .map(|(o, m)| (o, m.sequence))
                    .collect();
                (s.scope, origins)
            })
            .collect(),
    )
}

fn process<'c>(cluster: &'c ClusterFile, id: &str) -> Result<&'c ClusterReplica> {
    cluster
        .replica(id)
        .with_context(|| format!("process {id} is not in the cluster file"))
}

/// Step 1's wait: until each new host has applied, for every origin, what the
/// old host had applied when last looked at.
fn wait_copied(o: &Options, moving: &[Moving], say: &mut dyn FnMut(&str)) -> Result<()> {
    let started = Instant::now();
    let mut shown = usize::MAX;
    loop {
        let cluster = ClusterFile::load(&o.cluster).map_err(anyhow::Error::msg)?;
        let mut of: BTreeMap<&str, Option<_>> = BTreeMap::new();
        for m in moving {
            for id in [&m.old, &m.new] {
                if !of.contains_key(id.as_str()) {
                    of.insert(id, marks(process(&cluster, id)?));
                }
            }
        }
        let caught = moving
            .iter()
            .filter(|m| {
                let (Some(Some(old)), Some(Some(new))) =
                    (of.get(m.old.as_str()), of.get(m.new.as_str()))
                else {
                    return false;
                };
                let empty = BTreeMap::new();
                let had = new.get(m.scope.as_str()).unwrap_or(&empty);
                old.get(m.scope.as_str()).is_some_and(|want| {
                    want.iter()
                        .all(|(origin, seq)| had.get(origin).copied().unwrap_or(0) >= *seq)
                })
            })
            .count();
        if caught != shown {
            say(&format!(
                "  copy: {caught}/{} moving group scopes caught up ({:.1} s)",
                moving.len(),
                started.elapsed().as_secs_f64()
            ));
            shown = caught;
        }
        if caught == moving.len() {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < o.step_limit,
            "{} of {} moving group scopes not caught up after {:?}; the resize stays at its \
             copy step (run the same command again to resume)",
            moving.len() - caught,
            moving.len(),
            o.step_limit
        );
        std::thread::sleep(POLL);
    }
}

/// Step 2's wait: until every member of each moved group scope, in every
/// replica, has applied all of the old host's own stream there; and at least
/// `serve_min`, for clients to follow.
fn wait_drained(o: &Options, moving: &[Moving], say: &mut dyn FnMut(&str)) -> Result<()> {
    let started = Instant::now();
    let d = deployment(&o.cluster)?;
    let moving: Vec<&Moving> = moving.iter().filter(|m| m.drains).collect();
    let mut shown = usize::MAX;
    loop {
        let cluster = ClusterFile::load(&o.cluster).map_err(anyhow::Error::msg)?;
        let mut of: BTreeMap<String, Option<_>> = BTreeMap::new();
        let mut drained = 0;
        for m in &moving {
            let members = d.scope_members(&m.scope);
            // The old host first: it takes no more writes there, so what the
            // members hold afterwards is compared with its whole stream.
            for id in [m.old.clone()]
                .into_iter()
                .chain(members.iter().map(|id| id.to_string()))
            {
                if let std::collections::btree_map::Entry::Vacant(e) = of.entry(id) {
                    let got = marks(process(&cluster, e.key())?);
                    e.insert(got);
                }
            }
            let head = |at: &str| -> Option<u64> {
                let marks = of.get(at)?.as_ref()?;
                Some(
                    marks
                        .get(m.scope.as_str())
                        .and_then(|s| s.get(&m.old))
                        .copied()
                        .unwrap_or(0),
                )
            };
            let Some(own) = head(&m.old) else { continue };
            if members
                .iter()
                .all(|id| head(id.as_str()).is_some_and(|seq| seq >= own))
            {
                drained += 1;
            }
        }
        if drained != shown {
            say(&format!(
                "  serve: {drained}/{} moved group scopes hold all of their old host's writes \
                 everywhere ({:.1} s)",
                moving.len(),
                started.elapsed().as_secs_f64()
            ));
            shown = drained;
        }
        if drained == moving.len() && started.elapsed() >= o.serve_min {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < o.step_limit,
            "{} of {} moved group scopes still miss writes of their old host after {:?}; the \
             resize stays at its serve step (run the same command again to resume)",
            moving.len() - drained,
            moving.len(),
            o.step_limit
        );
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pangea_proto::v1::MigrationJob;

    fn job(id: &str, runner: &str, phase: &str) -> MigrationJob {
        MigrationJob {
            id: id.into(),
            runner: runner.into(),
            phase: phase.into(),
            ..Default::default()
        }
    }

    /// A resize waits for the moves running on the replica — the job on its
    /// process 0, a part on another — not for finished ones, nor for moves on
    /// another replica (one whose id merely starts the same way included).
    #[test]
    fn a_resize_waits_for_the_moves_running_on_its_replica() {
        let jobs = [
            job("m1", "euw1-a", "backfill"),
            job("m1.p1", "euw1-a.p1", "catch-up"),
            job("m2", "euw1-a", "done"),
            job("m3", "euw1-a", "failed"),
            job("m4", "euw1-b", "backfill"),
            job("m5", "euw1-ab", "backfill"),
        ];
        assert_eq!(
            unfinished_moves(&jobs, "euw1-a"),
            ["m1 (backfill)", "m1.p1 (catch-up)"]
        );
        assert!(unfinished_moves(&jobs, "use1-a").is_empty());
    }
}
