//! `pangea topology`: check, plan and diff the operator's files.

use anyhow::{Context, Result};
use clap::Subcommand;
use pangea_ops::local::{self, alive};
use pangea_topology::cluster::{ClusterFile, ClusterReplica};
use pangea_topology::plan::{Diff, Plan, WanBytes};
use pangea_topology::{Deployment, Tree};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Subcommand)]
pub(crate) enum TopologyCommand {
    /// Validate a topology (and placement) file; print every problem with file, line
    /// and key; exit non-zero if there is any.
    Check {
        topology: PathBuf,
        #[arg(long)]
        placement: Option<PathBuf>,
    },
    /// Show each scope's tree, predicted replication delays and WAN bytes.
    Plan {
        topology: PathBuf,
        #[arg(long)]
        placement: Option<PathBuf>,
        /// Print JSON (scopes, edges, delays, WAN bytes, every candidate link).
        #[arg(long)]
        json: bool,
        /// Also draw continents, regions, replicas and trees into this SVG file.
        #[arg(long)]
        svg: Option<PathBuf>,
    },
    /// Apply edited files to a running local cluster: validated first (an invalid file
    /// changes nothing), diff against the running files shown, changes that widen
    /// residency or drop a column family refused unless a flag names them, the
    /// running files kept in DIR/previous/, replicas added or removed, every replica
    /// reloads (any refusal puts the previous files back).
    Apply {
        /// The cluster file (`pangea cluster up` writes DIR/cluster.toml).
        #[arg(long)]
        cluster: PathBuf,
        topology: PathBuf,
        #[arg(long)]
        placement: Option<PathBuf>,
        /// Show the diff and what would be refused; change nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        allow: AllowDestructive,
    },
    /// Put back the files the last `apply` replaced (DIR/previous/), as an apply.
    Rollback {
        /// The cluster file (`pangea cluster up` writes DIR/cluster.toml).
        #[arg(long)]
        cluster: PathBuf,
        /// Show the diff and what would be refused; change nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        allow: AllowDestructive,
    },
    /// What changes between two versions of the files.
    Diff {
        old: PathBuf,
        new: PathBuf,
        #[arg(long)]
        placement_old: Option<PathBuf>,
        #[arg(long)]
        placement_new: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

/// Destructive changes an apply may make, each named (docs/operations.md, "Safe
/// applies").
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct AllowDestructive {
    /// Allow rows of TABLE under PREFIX to move to a policy with regions their
    /// current one lacks (TABLE:PREFIX; repeatable).
    #[arg(long, value_name = "TABLE:PREFIX")]
    pub widen_residency: Vec<String>,
    /// Allow policy NAME to gain regions (repeatable).
    #[arg(long, value_name = "NAME")]
    pub widen_policy: Vec<String>,
    /// Allow column family FAMILY to leave TABLE (TABLE:FAMILY; repeatable).
    #[arg(long, value_name = "TABLE:FAMILY")]
    pub drop_family: Vec<String>,
}

impl AllowDestructive {
    /// Whether a flag names `change`.
    pub(crate) fn allows(&self, change: &pangea_topology::plan::Destructive) -> bool {
        use pangea_topology::plan::Destructive as D;
        match change {
            D::WidenResidency { table, prefix, .. } => {
                self.widen_residency.contains(&format!("{table}:{prefix}"))
            }
            D::WidenPolicy { policy, .. } => self.widen_policy.iter().any(|p| p == policy.as_str()),
            D::DropFamily { table, family } => {
                self.drop_family.contains(&format!("{table}:{family}"))
            }
        }
    }
}

pub(crate) fn run(cmd: TopologyCommand) -> Result<()> {
    match cmd {
        TopologyCommand::Check {
            topology,
            placement,
        } => check(&topology, placement.as_deref()),
        TopologyCommand::Plan {
            topology,
            placement,
            json,
            svg,
        } => {
            let d = load(&topology, placement.as_deref())?;
            let plan = d.plan();
            if let Some(out) = svg {
                let trees: Vec<Tree> = d.scopes().map(|s| d.tree(s, None)).collect();
                std::fs::write(&out, pangea_topology::svg::render(&d, &trees))
                    .with_context(|| format!("writing {}", out.display()))?;
                eprintln!("wrote {}", out.display());
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&plan)?);
            } else {
                print_plan(&d, &plan);
            }
            Ok(())
        }
        TopologyCommand::Apply {
            cluster,
            topology,
            placement,
            dry_run,
            allow,
        } => apply(&cluster, &topology, placement.as_deref(), dry_run, &allow),
        TopologyCommand::Rollback {
            cluster,
            dry_run,
            allow,
        } => rollback(&cluster, dry_run, &allow),
        TopologyCommand::Diff {
            old,
            new,
            placement_old,
            placement_new,
            json,
        } => {
            let a = load(&old, placement_old.as_deref())?;
            let b = load(&new, placement_new.as_deref())?;
            let diff = a.diff(&b);
            if json {
                println!("{}", serde_json::to_string_pretty(&diff)?);
            } else {
                print_diff(&diff);
            }
            Ok(())
        }
    }
}

/// Loads and validates; problems become one error listing all of them.
pub(crate) fn load(topology: &Path, placement: Option<&Path>) -> Result<Deployment> {
    Deployment::load(topology, placement).map_err(|p| anyhow::anyhow!("{p}"))
}

fn check(topology: &Path, placement: Option<&Path>) -> Result<()> {
    let d = load(topology, placement)?;
    let t = &d.topology;
    println!(
        "ok: topology {:?}: {} replicas in {} regions on {} continents, {} links, {} app profiles",
        t.name,
        t.replicas.len(),
        t.regions.len(),
        t.continents.len(),
        t.links.len(),
        t.app_profiles.len()
    );
    if placement.is_some() {
        let p = &d.placement;
        println!(
            "ok: placement: {} tables, {} policies ({}), {} prefix rules, {} home rules",
            p.schema.tables.len(),
            p.policies.len(),
            p.policies
                .keys()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            p.rules.len(),
            p.home_rules.len()
        );
    }
    Ok(())
}

fn wan_line(label: &str, w: &WanBytes) {
    println!(
        "    {label:<10} {:>14.0} {:>14.0} {:>16.0} {:>10.0}",
        w.intra_region,
        w.inter_region,
        w.inter_continent,
        w.total()
    );
}

fn print_plan(d: &Deployment, plan: &Plan) {
    let t = &d.topology;
    println!(
        "topology {}: {} replicas, {} regions, {} continents, {} candidate edges",
        plan.topology,
        t.replicas.len(),
        t.regions.len(),
        t.continents.len(),
        plan.graph.links.len()
    );
    for s in &plan.scopes {
        println!(
            "\nscope {} ({} regions, {} replicas): {} tree edges, total {:.1} ms",
            s.name,
            s.regions.len(),
            s.replicas.len(),
            s.edges.len(),
            s.total_latency_ms
        );
        println!("  tree edges (round trip):");
        for e in &s.edges {
            let class = t.link_class(&e.a, &e.b).map_or("?", |c| c.as_str());
            println!(
                "    {:<14} — {:<14} {:>7.1} ms  {class}",
                e.a, e.b, e.latency_ms
            );
        }
        println!(
            "  one-way replication delay from each origin (worst replica): tree vs direct path"
        );
        for o in &s.delays {
            println!(
                "    {:<14} tree {:>7.1} ms   direct {:>7.1} ms",
                o.origin, o.max_tree_ms, o.max_direct_ms
            );
        }
        println!("  WAN bytes per 1 KiB mutation:");
        println!(
            "    {:<10} {:>14} {:>14} {:>16} {:>10}",
            "", "intra-region", "inter-region", "inter-continent", "total"
        );
        wan_line("tree", &s.wan_bytes_tree);
        wan_line("full mesh", &s.wan_bytes_mesh);
    }
}

pub(crate) fn print_diff(diff: &Diff) {
    if diff.is_empty() {
        println!("no changes");
        return;
    }
    for r in &diff.replicas_added {
        println!("+ replica {r}");
    }
    for r in &diff.replicas_removed {
        println!("- replica {r}");
    }
    for t in &diff.tree_changes {
        println!("scope {}: tree changes", t.scope);
        for e in &t.edges_added {
            println!("  + edge {} — {} ({:.1} ms)", e.a, e.b, e.latency_ms);
        }
        for e in &t.edges_removed {
            println!("  - edge {} — {} ({:.1} ms)", e.a, e.b, e.latency_ms);
        }
    }
    for p in &diff.policy_changes {
        let list = |v: &[pangea_topology::RegionId]| {
            v.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(", ")
        };
        println!(
            "policy {}: {} (+[{}] -[{}])",
            p.policy,
            p.change,
            list(&p.regions_added),
            list(&p.regions_removed)
        );
    }
    for c in &diff.placement_changes {
        let home = |h: &Option<pangea_topology::RegionId>| {
            h.as_ref().map_or("-".to_owned(), |r| r.to_string())
        };
        println!(
            "rows of {} under {:?} move: policy {} -> {}, home {} -> {}",
            c.table,
            c.prefix,
            c.old_policy,
            c.new_policy,
            home(&c.old_home),
            home(&c.new_home)
        );
    }
}

/// Where `apply` keeps the files it replaced.
fn previous_dir(cluster_path: &Path) -> PathBuf {
    cluster_path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
        .join("previous")
}

/// `pangea topology rollback --cluster FILE`: applies the files the last apply
/// replaced (which become the previous ones in turn).
pub(crate) fn rollback(cluster_path: &Path, dry_run: bool, allow: &AllowDestructive) -> Result<()> {
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
    apply(cluster_path, &t, p.as_deref(), dry_run, allow)
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
) -> Result<()> {
    if running.is_empty() {
        return Ok(());
    }
    let mut view = cluster.clone();
    view.replicas = all.to_vec();
    let d = load(&view.topology, view.placement.as_deref())?;
    let region = running[0].region.clone();
    let profile = d
        .topology
        .app_profiles
        .keys()
        .next()
        .cloned()
        .context("the topology has no app profile to route operator requests with")?;
    let config = pangea_client::ClientConfig::from_cluster(&view, &region, &profile)?
        .with_credential(pangea_client::Credential::Operator(
            pangea_ops::local::CLUSTER_OPERATOR.into(),
        ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = pangea_client::Client::connect(config).await?;
        let mut refused = Vec::new();
        for r in running {
            match client.reload(&r.id.as_str().into()).await {
                Ok(changes) if changes.is_empty() => println!("{}: no changes", r.id),
                Ok(changes) => println!("{}: {}", r.id, changes.join("; ")),
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

/// `pangea topology apply --cluster FILE NEW [--placement NEW]` on a local cluster:
/// validates the new files (an invalid file changes nothing and says why), shows the
/// diff, writes the new topology (addresses kept, new replicas given ports), starts
/// added replicas (they bootstrap by snapshot), makes every running replica reload
/// (SIGHUP), then stops removed replicas.
pub(crate) fn apply(
    cluster_path: &Path,
    new_topology: &Path,
    new_placement: Option<&Path>,
    dry_run: bool,
    allow: &AllowDestructive,
) -> Result<()> {
    use nix::sys::signal::Signal;
    let mut cluster = ClusterFile::load(cluster_path).map_err(anyhow::Error::msg)?;
    let placement = new_placement
        .map(Path::to_path_buf)
        .or_else(|| cluster.placement.clone());
    let new = load(new_topology, placement.as_deref())
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
    let old = load(&cluster.topology, cluster.placement.as_deref())?;
    let diff = old.diff(&new);
    if diff.is_empty() {
        println!("no changes");
    }
    print_diff(&diff);
    let destructive = old.destructive_changes(&new);
    let refused: Vec<String> = destructive
        .iter()
        .filter(|d| !allow.allows(d))
        .map(|d| format!("{d} (allow with {})", d.flag()))
        .collect();
    for d in destructive.iter().filter(|d| allow.allows(d)) {
        println!("allowed by flag: {d}");
    }
    if !refused.is_empty() {
        anyhow::bail!(
            "refused, nothing changed: the new files would\n  {}",
            refused.join("\n  ")
        );
    }
    if dry_run {
        println!("dry run: nothing changed");
        return Ok(());
    }
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
            let sockets = local::ReplicaSockets::fresh()?;
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
                &crate::pangea_binary()?,
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
        println!("started replica {} ({})", r.id, r.region);
    }
    // Every running replica re-reads the files, asked as the cluster's operator
    // (authorized and recorded in each replica's audit log).
    let running: Vec<&ClusterReplica> = kept.iter().filter(|r| r.pid.is_some_and(alive)).collect();
    if let Err(e) = reload_replicas(&cluster, &all, &running) {
        // Put the running files back and have every replica re-read them, so files
        // and replicas agree again.
        write_replacing(&cluster.topology, &old_topology)?;
        if let Some((path, text)) = &old_placement {
            write_replacing(path, text)?;
        }
        let _ = reload_replicas(&cluster, &all, &running);
        return Err(e.context(
            "the new files were refused; the previous topology and placement files are back \
             in place and the replicas re-read them",
        ));
    }
    println!("{} running replicas reloaded", running.len());
    for r in &added {
        local::wait_healthy(r, local::HEALTH_WAIT, &mut |phase| {
            println!("  {}: {phase}", r.id)
        })?;
    }
    // Removed replicas stop once the others have let them go.
    if !removed.is_empty() {
        std::thread::sleep(Duration::from_millis(500));
        for r in &removed {
            if let Some(pid) = r.pid {
                local::signal(pid, Signal::SIGTERM);
                println!("stopping replica {} (removed)", r.id);
            }
        }
    }
    // `all` was built before the new replicas had pids.
    cluster.replicas = kept;
    cluster.replicas.extend(added.iter().cloned());
    cluster.replicas.sort_by(|a, b| a.id.cmp(&b.id));
    cluster.name = new.topology.name;
    cluster.save(cluster_path).map_err(anyhow::Error::msg)?;
    println!(
        "applied: {} replicas ({} added, {} removed)",
        cluster.replicas.len(),
        added.len(),
        removed.len()
    );
    Ok(())
}
