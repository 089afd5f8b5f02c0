//! Changing a running local cluster's topology and placement (`pangea topology
//! apply` and `rollback`): the new files are validated and diffed against the
//! running ones first ([`Apply::prepare`]), destructive changes are the caller's to
//! allow ([`Apply::refused`]), then [`Apply::run`] makes the change — the running
//! files kept in DIR/previous/, replicas added or removed, every replica reloading,
//! and any refusal putting the previous files back (docs/operations.md, "Safe
//! applies").

use crate::local::{self, alive};
use anyhow::{Context, Result};
use pangea_topology::Deployment;
use pangea_topology::cluster::{ClusterFile, ClusterReplica};
use pangea_topology::plan::{Destructive, Diff};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A change to a running local cluster, validated and diffed, not made yet.
#[derive(Debug)]
pub struct Apply {
    cluster_path: PathBuf,
    cluster: ClusterFile,
    new: Deployment,
    new_topology: PathBuf,
    new_placement: Option<PathBuf>,
    /// What changes, against the files the replicas run.
    pub diff: Diff,
    /// The changes that widen residency or drop data, each to be allowed by name.
    pub destructive: Vec<Destructive>,
    /// A rollback's copies of DIR/previous/ (the apply overwrites it).
    _copies: Option<tempfile::TempDir>,
}

/// What an apply did.
#[derive(Debug, Clone, Copy)]
pub struct Applied {
    pub replicas: usize,
    pub added: usize,
    pub removed: usize,
}

/// Where `apply` keeps the files it replaced.
fn previous_dir(cluster_path: &Path) -> PathBuf {
    cluster_path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
        .join("previous")
}

impl Apply {
    /// Reads the running cluster and the new files: an invalid file, or a placement
    /// with no table, is an error and changes nothing.
    pub fn prepare(
        cluster_path: &Path,
        new_topology: &Path,
        new_placement: Option<&Path>,
    ) -> Result<Apply> {
        Apply::prepare_kept(cluster_path, new_topology, new_placement, None)
    }

    /// An apply of the files the last apply replaced (DIR/previous/), which become
    /// the previous ones in turn.
    pub fn rollback(cluster_path: &Path) -> Result<Apply> {
        let previous = previous_dir(cluster_path);
        let topology = previous.join("topology.toml");
        anyhow::ensure!(
            topology.exists(),
            "no previous files in {}: nothing was applied to this cluster yet",
            previous.display()
        );
        // Copies: the apply overwrites DIR/previous/ with the files it replaces.
        let tmp = tempfile::tempdir()?;
        let t = tmp.path().join("topology.toml");
        std::fs::copy(&topology, &t)?;
        let p = previous.join("placement.toml");
        let p = if p.exists() {
            let to = tmp.path().join("placement.toml");
            std::fs::copy(&p, &to)?;
            Some(to)
        } else {
            None
        };
        Apply::prepare_kept(cluster_path, &t, p.as_deref(), Some(tmp))
    }

    fn prepare_kept(
        cluster_path: &Path,
        new_topology: &Path,
        new_placement: Option<&Path>,
        copies: Option<tempfile::TempDir>,
    ) -> Result<Apply> {
        let cluster = ClusterFile::load(cluster_path).map_err(anyhow::Error::msg)?;
        let placement = new_placement
            .map(Path::to_path_buf)
            .or_else(|| cluster.placement.clone());
        let new = local::load(new_topology, placement.as_deref())
            .context("the new files are invalid; nothing changed")?;
        if new
            .placement
            .schema
            .tables
            .keys()
            .all(|t| t.starts_with('_'))
        {
            anyhow::bail!(
                "the new placement defines no table: every row would lose its schema; nothing changed"
            );
        }
        // Against the running files (what the replicas were last given).
        let old = local::load(&cluster.topology, cluster.placement.as_deref())?;
        let layout = old.layout_changes(&new);
        if !layout.is_empty() {
            anyhow::bail!("{}; nothing changed", layout.join("; "));
        }
        let diff = old.diff(&new);
        let destructive = old.destructive_changes(&new);
        Ok(Apply {
            cluster_path: cluster_path.to_owned(),
            cluster,
            new,
            new_topology: new_topology.to_owned(),
            new_placement: new_placement.map(Path::to_path_buf),
            diff,
            destructive,
            _copies: copies,
        })
    }

    /// The destructive changes `allowed` does not allow, each with the flag that
    /// would.
    pub fn refused(&self, allowed: impl Fn(&Destructive) -> bool) -> Vec<String> {
        self.destructive
            .iter()
            .filter(|d| !allowed(d))
            .map(|d| format!("{d} (allow with {})", d.flag()))
            .collect()
    }
}

/// Writes `text` beside `path` and renames it over (atomic for readers; safe when
/// the source was `path` itself).
fn write_replacing(path: &Path, text: &[u8]) -> Result<()> {
    let tmp = path.with_extension("toml.new");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

/// Asks each of `running` to reload its files, with the operator certificate of
/// the cluster's certificate directory. A replica that refuses (an invalid or
/// unsafe file) fails the apply, naming the replica and its reason.
fn reload_replicas(
    cluster: &ClusterFile,
    all: &[ClusterReplica],
    running: &[&ClusterReplica],
    say: &mut dyn FnMut(&str),
) -> Result<()> {
    if running.is_empty() {
        return Ok(());
    }
    let mut view = cluster.clone();
    view.replicas = all.to_vec();
    let config = local::operator_config(&view, &running[0].region)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = pangea_client::Client::connect(config).await?;
        let mut refused = Vec::new();
        for r in running {
            match client.reload(&r.id.as_str().into()).await {
                Ok(changes) if changes.is_empty() => say(&format!("{}: no changes", r.id)),
                Ok(changes) => say(&format!("{}: {}", r.id, changes.join("; "))),
                Err(e) => refused.push(format!("{}: {e}", r.id)),
            }
        }
        anyhow::ensure!(
            refused.is_empty(),
            "reload refused:\n  {}",
            refused.join("\n  ")
        );
        anyhow::Ok(())
    })
}

/// How long replicas leaving the topology may take to hand their stream on.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// Marks the replicas `leaving` as draining in the cluster's topology file
/// (`draining = true`: they refuse writes, routes leave them out), has every
/// running replica reload it, and waits until every peer holding a scope of
/// theirs has applied all of their own stream there. On any failure the file
/// `original` goes back and the replicas reload it.
fn drain(
    cluster: &ClusterFile,
    leaving: &[String],
    original: &[u8],
    say: &mut dyn FnMut(&str),
) -> Result<()> {
    let text = std::str::from_utf8(original).context("the topology file is not UTF-8")?;
    let mut doc: toml_edit::DocumentMut = text.parse().context("topology")?;
    local::for_each_replica(&mut doc, |rep| {
        if rep
            .get("id")
            .and_then(|v| v.as_str())
            .is_some_and(|id| leaving.iter().any(|l| l == id))
        {
            rep["draining"] = toml_edit::value(true);
        }
    });
    write_replacing(&cluster.topology, doc.to_string().as_bytes())?;
    let running: Vec<&ClusterReplica> = cluster
        .replicas
        .iter()
        .filter(|r| r.pid.is_some_and(alive))
        .collect();
    say(&format!(
        "draining {}: no more writes there; waiting for their writes to reach every peer",
        leaving.join(", ")
    ));
    let drained = reload_replicas(cluster, &cluster.replicas, &running, say)
        .and_then(|()| wait_drained(leaving, &running, say));
    if let Err(e) = drained {
        write_replacing(&cluster.topology, original)?;
        let _ = reload_replicas(cluster, &cluster.replicas, &running, say);
        return Err(e.context("nothing changed: the previous topology file is back in place"));
    }
    Ok(())
}

/// Until every running process that holds a scope of a process of `leaving`
/// has applied that process's own stream there as far as it went.
fn wait_drained(
    leaving: &[String],
    running: &[&ClusterReplica],
    say: &mut dyn FnMut(&str),
) -> Result<()> {
    let of_leaving = |id: &str| {
        leaving.iter().any(|l| {
            id == l
                || id
                    .strip_prefix(l.as_str())
                    .is_some_and(|p| p.starts_with(".p"))
        })
    };
    let started = std::time::Instant::now();
    loop {
        let marks: Vec<(&str, _)> = running
            .iter()
            .map(|r| (r.id.as_str(), crate::resize::marks(r)))
            .collect();
        let mut missing = 0;
        for (id, own) in marks.iter().filter(|(id, _)| of_leaving(id)) {
            let Some(own) = own else {
                missing += 1;
                continue;
            };
            for (scope, origins) in own {
                let head = origins.get(*id).copied().unwrap_or(0);
                if head == 0 {
                    continue;
                }
                missing += marks
                    .iter()
                    .filter(|(peer, _)| peer != id && !of_leaving(peer))
                    .filter_map(|(_, m)| m.as_ref()?.get(scope))
                    .filter(|peer| peer.get(*id).copied().unwrap_or(0) < head)
                    .count();
            }
        }
        if missing == 0 {
            say(&format!(
                "  drained in {:.1} s",
                started.elapsed().as_secs_f64()
            ));
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < DRAIN_LIMIT,
            "the writes of {} had not reached every peer after {DRAIN_LIMIT:?} ({missing} \
             streams behind)",
            leaving.join(", ")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

impl Apply {
    /// Makes the change: writes the new topology (addresses kept, new replicas given
    /// ports), starts added replicas (running `binary`; they bootstrap by snapshot),
    /// makes every running replica reload, then stops removed replicas. `say` hears
    /// each step. Refused destructive changes must have been checked by the caller
    /// ([`Apply::refused`]).
    pub fn run(self, binary: &Path, say: &mut dyn FnMut(&str)) -> Result<Applied> {
        use nix::sys::signal::Signal;
        let Apply {
            cluster_path,
            mut cluster,
            new,
            new_topology,
            new_placement,
            ..
        } = self;
        let (cluster_path, new_topology, new_placement) = (
            cluster_path.as_path(),
            new_topology.as_path(),
            new_placement.as_deref(),
        );
        let dir = cluster_path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        // Replicas: keep the running ones, add new ones with fresh ports.
        let mut added = Vec::new();
        let mut added_sockets = Vec::new();
        for r in new.topology.replicas.values() {
            if cluster.replica(r.id.as_str()).is_none() {
                pangea_net::certs::issue_replica(&cluster.certs, r.id.as_str(), r.region.as_str())
                    .with_context(|| format!("issuing the certificate of replica {}", r.id))?;
                // A replica's process p listens on its port + p (a resize adds
                // processes to a running replica); a new replica anywhere free.
                let sockets = match (&r.address, r.index) {
                    (Some(address), 1..) => {
                        local::ReplicaSockets::bind(address, "127.0.0.1:0", r.id.as_str())
                            .with_context(|| {
                                format!(
                                    "process {} of replica {} listens on its replica's port + \
                                     {0}, which is taken",
                                    r.index, r.of
                                )
                            })?
                    }
                    _ => local::ReplicaSockets::fresh()?,
                };
                added.push(local::record(
                    &dir,
                    r.id.as_str(),
                    r.region.as_str(),
                    &sockets,
                )?);
                added_sockets.push(sockets);
            }
        }
        let removed: Vec<ClusterReplica> = cluster
            .replicas
            .iter()
            .filter(|r| new.topology.replica(&r.id).is_none())
            .cloned()
            .collect();
        let kept: Vec<ClusterReplica> = cluster
            .replicas
            .iter()
            .filter(|r| new.topology.replica(&r.id).is_some())
            .cloned()
            .collect();
        let all: Vec<ClusterReplica> = kept.iter().chain(&added).cloned().collect();
        // What runs now: kept in DIR/previous/ for `pangea topology rollback`, and put
        // back at once if a replica refuses the new files.
        let old_topology = std::fs::read(&cluster.topology)?;
        let old_placement = match &cluster.placement {
            Some(p) => Some((p.clone(), std::fs::read(p)?)),
            None => None,
        };
        // Replicas that leave stop taking writes first, and go only once their
        // stream has reached every peer: removed at once, their last writes
        // would be refused by peers that no longer count them as members.
        let leaving: Vec<String> = local::load(&cluster.topology, cluster.placement.as_deref())?
            .topology
            .replicas
            .values()
            .filter(|r| r.index == 0 && new.topology.replica(r.id.as_str()).is_none())
            .map(|r| r.id.to_string())
            .collect();
        if !leaving.is_empty() {
            drain(&cluster, &leaving, &old_topology, say)?;
        }
        let previous = previous_dir(cluster_path);
        std::fs::create_dir_all(&previous)?;
        write_replacing(&previous.join("topology.toml"), &old_topology)?;
        if let Some((_, text)) = &old_placement {
            write_replacing(&previous.join("placement.toml"), text)?;
        }
        let text = local::fill_addresses(&std::fs::read_to_string(new_topology)?, &all)?;
        let tmp = cluster.topology.with_extension("toml.new");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &cluster.topology)?;
        if let Some(p) = new_placement {
            let to = cluster
                .placement
                .clone()
                .unwrap_or_else(|| dir.join("placement.toml"));
            // Copying the running file onto itself would truncate it: write a copy
            // beside it, then rename over (also atomic for replicas reading it).
            let text = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
            write_replacing(&to, &text)?;
            cluster.placement = Some(to);
        }
        // New replicas first, so that the others find them when they reload.
        for (r, sockets) in added.iter_mut().zip(added_sockets) {
            r.pid = Some(
                local::spawn_replica(
                    binary,
                    &cluster.topology,
                    cluster.placement.as_deref(),
                    &cluster.certs,
                    r,
                    sockets,
                    local::StartFlags::of(&cluster),
                    &[],
                )?
                .id(),
            );
            say(&format!("started replica {} ({})", r.id, r.region));
        }
        // Every running replica re-reads the files, asked as the cluster's operator
        // (authorized and recorded in each replica's audit log).
        let running: Vec<&ClusterReplica> =
            kept.iter().filter(|r| r.pid.is_some_and(alive)).collect();
        if let Err(e) = reload_replicas(&cluster, &all, &running, say) {
            // Put the running files back and have every replica re-read them, so files
            // and replicas agree again.
            write_replacing(&cluster.topology, &old_topology)?;
            if let Some((path, text)) = &old_placement {
                write_replacing(path, text)?;
            }
            let _ = reload_replicas(&cluster, &all, &running, say);
            return Err(e.context(
                "the new files were refused; the previous topology and placement files are back \
             in place and the replicas re-read them",
            ));
        }
        say(&format!("{} running replicas reloaded", running.len()));
        for r in &added {
            local::wait_healthy(r, local::HEALTH_WAIT, &mut |phase| {
                say(&format!("  {}: {phase}", r.id))
            })?;
        }
        // Removed replicas stop once the others have let them go.
        if !removed.is_empty() {
            std::thread::sleep(Duration::from_millis(500));
            for r in &removed {
                if let Some(pid) = r.pid {
                    local::signal(pid, Signal::SIGTERM);
                    say(&format!("stopping replica {} (removed)", r.id));
                }
            }
        }
        // `all` was built before the new replicas had pids.
        cluster.replicas = kept;
        cluster.replicas.extend(added.iter().cloned());
        cluster.replicas.sort_by(|a, b| a.id.cmp(&b.id));
        cluster.name = new.topology.name;
        cluster.save(cluster_path).map_err(anyhow::Error::msg)?;
        Ok(Applied {
            replicas: cluster.replicas.len(),
            added: added.len(),
            removed: removed.len(),
        })
    }
}
