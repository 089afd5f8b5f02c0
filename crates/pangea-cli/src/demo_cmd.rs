//! `pangea demo`: flags for `pangea_ops::demo`, the main job on an embedded
//! default.

use crate::parse_duration;
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// A topology file (default: the embedded topology/local-3-regions.toml).
    #[arg(long)]
    topology: Option<PathBuf>,
    #[arg(long, requires = "topology")]
    placement: Option<PathBuf>,
    /// Where the cluster lives (default: a fresh directory under the system temp dir).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Stop after this long (default: run until Ctrl-C).
    #[arg(long)]
    duration: Option<String>,
    /// Clients per region.
    #[arg(long, default_value_t = 4)]
    clients_per_region: usize,
    /// Requests per second per client.
    #[arg(long, default_value_t = 50)]
    rate: u64,
    /// Leave the cluster running at the end (stop it with `pangea cluster down`).
    #[arg(long)]
    keep: bool,
    /// Run every replica as this many processes, each hosting a range of the
    /// shard groups (docs/sharding.md).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    processes_per_replica: Option<u32>,
    /// Spread rows over this many shard groups (default: the topology's; with
    /// --processes-per-replica, at least 4 per process).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    shard_groups: Option<u32>,
}

pub(crate) fn run(a: DemoArgs) -> Result<()> {
    pangea_ops::demo::run(
        &pangea_ops::demo::Options {
            topology: a.topology,
            placement: a.placement,
            data_dir: a.data_dir,
            duration: a.duration.as_deref().map(parse_duration).transpose()?,
            clients_per_region: a.clients_per_region,
            rate: a.rate,
            keep: a.keep,
            processes_per_replica: a.processes_per_replica,
            shard_groups: a.shard_groups,
            binary: crate::pangea_binary()?,
        },
        &|line| println!("{line}"),
    )
}
