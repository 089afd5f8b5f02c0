//! `pangea topology`: check, plan and diff the operator's files.

use anyhow::{Context, Result};
use clap::Subcommand;
use pangea_ops::apply::Apply;
use pangea_topology::plan::{Diff, Plan, WanBytes};
use pangea_topology::{Deployment, Tree};
use std::path::{Path, PathBuf};

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
        /// Also draw the plan into this SVG file: a panel per scope with its policy's
        /// regions tinted (the others hatched, "excluded"), its tree routed between
        /// the replicas, each edge labelled with its round trip, and a legend.
        #[arg(long, value_name = "OUT")]
        svg: Option<PathBuf>,
        /// Also write the plan as Graphviz source into this file: continents and
        /// regions as clusters, every scope's tree edges in its colour with their round
        /// trips, each edge tagged `class="scope-NAME"` (e.g. `dot -Tpng OUT`).
        #[arg(long, value_name = "OUT")]
        dot: Option<PathBuf>,
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
            dot,
        } => {
            let d = load(&topology, placement.as_deref())?;
            let plan = d.plan();
            let trees: Vec<Tree> = d.policies().map(|s| d.tree(s, None)).collect();
            let write = |out: &Path, text: String| -> Result<()> {
                std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
                eprintln!("wrote {}", out.display());
                Ok(())
            };
            if let Some(out) = svg {
                write(&out, pangea_topology::svg::render(&d, &trees))?;
            }
            if let Some(out) = dot {
                write(&out, pangea_topology::svg::dot(&d, &trees))?;
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
        } => apply(
            Apply::prepare(&cluster, &topology, placement.as_deref())?,
            dry_run,
            &allow,
        ),
        TopologyCommand::Rollback {
            cluster,
            dry_run,
            allow,
        } => apply(Apply::rollback(&cluster)?, dry_run, &allow),
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
                // What `apply` would refuse outright (docs/sharding.md).
                let layout = a.layout_changes(&b);
                if !diff.is_empty() || layout.is_empty() {
                    print_diff(&diff);
                }
                for change in layout {
                    println!("! {change}: `topology apply` refuses it");
                }
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
    print_shards(d, plan);
}

/// Shard groups: which process of each replica hosts which groups, and each
/// table's partition key (docs/sharding.md).
fn print_shards(d: &Deployment, plan: &Plan) {
    let g = plan.shard_groups;
    println!(
        "
shard groups: {g}"
    );
    for (table, schema) in &d.placement.schema.tables {
        if let Some(pk) = &schema.partition_key {
            println!(
                "  table {table}: partition key = the row key up to separator {:?} number {}",
                pk.separator as char, pk.fields
            );
        }
    }
    if plan.shards.iter().all(|r| r.groups.len() == 1) {
        println!("  every replica: 1 process hosting every group");
        return;
    }
    for r in &plan.shards {
        let ranges: Vec<String> = r
            .groups
            .iter()
            .map(|range| match range.len() {
                1 => format!("{}", range.start),
                _ => format!("{}–{}", range.start, range.end - 1),
            })
            .collect();
        println!(
            "  {:<14} {} process{}: groups {}",
            r.replica,
            r.groups.len(),
            if r.groups.len() == 1 { "" } else { "es" },
            ranges.join(" | ")
        );
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

/// `pangea topology apply` and `rollback`: shows the diff, refuses destructive
/// changes no flag allows, then applies (unless `dry_run`).
fn apply(change: Apply, dry_run: bool, allow: &AllowDestructive) -> Result<()> {
    if change.diff.is_empty() {
        println!("no changes");
    }
    print_diff(&change.diff);
    for d in change.destructive.iter().filter(|d| allow.allows(d)) {
        println!("allowed by flag: {d}");
    }
    let refused = change.refused(|d| allow.allows(d));
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
    let done = change.run(&crate::pangea_binary()?, &mut |line| println!("{line}"))?;
    println!(
        "applied: {} replicas ({} added, {} removed)",
        done.replicas, done.added, done.removed
    );
    Ok(())
}
