//! `pangea start` and `pangea certs`: run a replica, make its certificates.

use anyhow::Result;
use clap::{Args, Subcommand};
use serde::Serialize;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Flags of `pangea start`; each may also come from the config file or `PANGEA_*`.
#[derive(Debug, Args, Serialize)]
pub(crate) struct StartArgs {
    /// A node config file (TOML); flags and PANGEA_* variables override it.
    #[arg(long)]
    #[serde(skip)]
    config: Option<PathBuf>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    topology: Option<PathBuf>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    placement: Option<PathBuf>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    replica: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<PathBuf>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    certs: Option<PathBuf>,
    /// QUIC listen address (default: the replica's address in the topology).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<SocketAddr>,
    /// Admin HTTP address for /metrics, /health, /watermarks.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    admin: Option<SocketAddr>,
    /// Delay replication traffic by the topology's latencies (local clusters).
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    emulate_wan: bool,
    /// fsync (default) or os-buffer.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    durability: Option<String>,
}

pub(crate) fn start(args: StartArgs) -> Result<()> {
    crate::init_logging();
    let config = pangea_node::NodeConfig::load(args.config.as_deref(), &args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let shutdown = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
        };
        pangea_node::run(config, shutdown).await
    })
}

#[derive(Debug, Subcommand)]
pub(crate) enum CertsCommand {
    /// Create the cluster CA in DIR (ca.pem, ca.key).
    Init {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Issue a replica or client certificate signed by the cluster CA.
    Issue {
        #[arg(long)]
        dir: PathBuf,
        /// A replica id (its region comes from --region or --topology).
        #[arg(long, conflicts_with = "client")]
        replica: Option<String>,
        #[arg(long, requires = "replica")]
        region: Option<String>,
        /// Read the replica's region from this topology file.
        #[arg(long)]
        topology: Option<PathBuf>,
        /// A client name (frontends, tools).
        #[arg(long)]
        client: Option<String>,
        /// The app profile the client acts for.
        #[arg(long, requires = "client")]
        app_profile: Option<String>,
    },
}

pub(crate) fn certs(cmd: CertsCommand) -> Result<()> {
    match cmd {
        CertsCommand::Init { dir } => {
            pangea_net::certs::init_ca(&dir)?;
            println!("created cluster CA in {}", dir.display());
        }
        CertsCommand::Issue {
            dir,
            replica: Some(id),
            region,
            topology,
            ..
        } => {
            let region = match (region, topology) {
                (Some(r), _) => r,
                (None, Some(t)) => {
                    let t =
                        pangea_topology::Topology::load(&t).map_err(|p| anyhow::anyhow!("{p}"))?;
                    t.region_of(&id)
                        .map(|r| r.to_string())
                        .ok_or_else(|| anyhow::anyhow!("replica {id:?} is not in the topology"))?
                }
                (None, None) => anyhow::bail!("--replica needs --region or --topology"),
            };
            pangea_net::certs::issue_replica(&dir, &id, &region)?;
            println!(
                "issued replica certificate {id} ({region}) in {}",
                dir.display()
            );
        }
        CertsCommand::Issue {
            dir,
            client: Some(name),
            app_profile,
            ..
        } => {
            let profile = app_profile.unwrap_or_else(|| "frontend".into());
            pangea_net::certs::issue_client(&dir, &name, &profile)?;
            println!(
                "issued client certificate {name} (app profile {profile}) in {}",
                dir.display()
            );
        }
        CertsCommand::Issue { .. } => anyhow::bail!("say --replica ID or --client NAME"),
    }
    Ok(())
}
