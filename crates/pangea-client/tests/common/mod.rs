//! An in-process local cluster for the client's tests: every replica of a topology
//! runs `pangea_node::run` on 127.0.0.1 (real QUIC sockets, real fjall stores, mutual
//! TLS), in this test's tokio runtime, and stops when the cluster is dropped.

#![allow(dead_code)]

use anyhow::Result;
use pangea_topology::cluster::{ClusterFile, ClusterReplica};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One cluster at a time per test binary: several clusters of in-process replicas at
/// once would fight for the machine's two cores and make latencies meaningless.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub(crate) struct LocalCluster {
    _serial: tokio::sync::MutexGuard<'static, ()>,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) file: ClusterFile,
    pub(crate) cluster_path: PathBuf,
    stop: tokio::sync::watch::Sender<bool>,
    nodes: Vec<tokio::task::JoinHandle<Result<()>>>,
}

pub(crate) fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

impl LocalCluster {
    pub(crate) async fn start(
        topology: &str,
        placement: &str,
        emulate_wan: bool,
    ) -> Result<LocalCluster> {
        let serial = SERIAL.lock().await;
        let dir = tempfile::tempdir()?;
        let d = pangea_topology::Deployment::load(&repo(topology), Some(&repo(placement)))
            .map_err(|p| anyhow::anyhow!("{p}"))?;
        let certs = dir.path().join("certs");
        pangea_net::certs::init_ca(&certs)?;
        for r in d.topology.replicas.values() {
            pangea_net::certs::issue_replica(&certs, r.id.as_str(), r.region.as_str())?;
        }
        for p in d.topology.app_profiles.keys() {
            pangea_net::certs::issue_client(&certs, &format!("client-{p}"), p)?;
        }
        pangea_net::certs::issue_operator(&certs, "operator")?;
        let mut replicas = Vec::new();
        let mut sockets = Vec::new();
        let mut text = std::fs::read_to_string(repo(topology))?;
        for r in d.topology.replicas.values() {
            // Bound here and handed to the replica: no other test can take the port
            // between the pick and the replica's start.
            let socket = pangea_net::bind_udp_socket("127.0.0.1:0".parse()?)?;
            let address = socket.local_addr()?.to_string();
            sockets.push(socket);
            // Fill in the address right after the replica's id line.
            text = text.replacen(
                &format!("id = \"{}\"\n", r.id),
                &format!("id = \"{}\"\n    address = \"{address}\"\n", r.id),
                1,
            );
            replicas.push(ClusterReplica {
                id: r.id.to_string(),
                region: r.region.to_string(),
                address,
                admin: String::new(),
                data_dir: dir.path().join("replicas").join(r.id.as_str()),
                pid: None,
                log: None,
            });
        }
        let topo_path = dir.path().join("topology.toml");
        std::fs::write(&topo_path, text)?;
        let place_path = dir.path().join("placement.toml");
        std::fs::copy(repo(placement), &place_path)?;
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let mut nodes = Vec::new();
        for (r, socket) in replicas.iter().zip(sockets) {
            let sockets = pangea_node::Sockets {
                quic: Some(socket),
                admin: None,
            };
            let config = pangea_node::NodeConfig {
                topology: topo_path.clone(),
                placement: Some(place_path.clone()),
                replica: r.id.clone(),
                data_dir: r.data_dir.clone(),
                certs: certs.clone(),
                listen: None,
                admin: None,
                emulate_wan,
                wan_seed: 7,
                durability: pangea_node::config::Durability::Fsync,
                otlp_endpoint: None,
                heartbeat_interval_ms: 50,
                client_requests_max: 4_096,
                drain_ms: 2_000,
                clock_offset_ms: 0,
                fault_injection: false,
                // A fresh cluster: empty stores are the truth.
                new_cluster: true,
                // These tests never rotate certificates.
                certs_reload_interval_ms: 0,
                // As `pangea cluster up` runs them: one runtime thread each.
                threads: 1,
                serve_poll_us: 0,
                driver_nice: 5,
                compaction_nice: 10,
                row_cache_mib: 64,
                frame_budget_connection_mib: 64,
                frame_budget_mib: 256,
                retry_above: 64,
                handshakes_max: 512,
                handshakes_per_source_max: 128,
                connections_max: 8_192,
                connections_per_source_max: 1_024,
                disk_reserve_mib: 256,
                huge_pages: false,
            };
            let mut rx = stop_rx.clone();
            // Each replica on its own thread and runtime, as separate processes would
            // be: the test's own tasks (clients) do not share a scheduler with them.
            let (done_tx, done_rx) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let rt = config.runtime().build();
                let result = match rt {
                    Ok(rt) => {
                        rt.block_on(pangea_node::run_with_sockets(config, sockets, async move {
                            let _ = rx.wait_for(|s| *s).await;
                        }))
                    }
                    Err(e) => Err(e.into()),
                };
                let _ = done_tx.send(result);
            });
            nodes.push(tokio::spawn(async move {
                done_rx
                    .await
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("replica thread died")))
            }));
        }
        let file = ClusterFile {
            name: d.topology.name.clone(),
            topology: topo_path,
            placement: Some(place_path),
            certs,
            emulate_wan,
            fault_injection: false,
            replicas,
        };
        let cluster_path = dir.path().join("cluster.toml");
        file.save(&cluster_path).map_err(anyhow::Error::msg)?;
        let table = d
            .placement
            .schema
            .tables
            .keys()
            .next()
            .map(|t| t.to_string())
            .ok_or_else(|| anyhow::anyhow!("{placement} declares no table"))?;
        let cluster = LocalCluster {
            _serial: serial,
            dir,
            file,
            cluster_path,
            stop,
            nodes,
        };
        cluster.wait_serving(&table).await?;
        Ok(cluster)
    }

    /// Waits until every replica serves reads: a replica just started listens for
    /// its peers' heartbeats first and answers reads `unavailable` meanwhile
    /// (readiness.rs), which a test that reads at once would take for a failure.
    async fn wait_serving(&self, table: &str) -> Result<()> {
        let operator = self.operator(&self.file.replicas[0].region).await?;
        let until = std::time::Instant::now() + Duration::from_secs(30);
        for r in &self.file.replicas {
            let id = pangea_core::ReplicaId::from(r.id.as_str());
            loop {
                let probe = operator
                    .scan_at(
                        &id,
                        table,
                        bytes::Bytes::from_static(b"\0readiness-probe/"),
                        &pangea_client::ScanOptions::default(),
                        &pangea_client::ReadFilter::default(),
                        Duration::from_secs(2),
                    )
                    .await;
                match probe {
                    Ok(_) => break,
                    Err(e) if std::time::Instant::now() < until => {
                        tracing::debug!(replica = %r.id, "not serving yet: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => anyhow::bail!("replica {} serves no reads after 30 s: {e}", r.id),
                }
            }
        }
        Ok(())
    }

    /// A client acting as the cluster's operator (placement moves, job status,
    /// audits), from `region`.
    pub(crate) async fn operator(&self, region: &str) -> Result<pangea_client::Client> {
        let config = pangea_client::ClientConfig::from_cluster(&self.file, region, "frontend")?
            .with_credential(pangea_client::Credential::Operator("operator".into()));
        Ok(pangea_client::Client::connect(config).await?)
    }

    /// Stops every replica gracefully and waits for them.
    pub(crate) async fn stop(self) -> Result<tempfile::TempDir> {
        let _ = self.stop.send(true);
        for n in self.nodes {
            tokio::time::timeout(Duration::from_secs(10), n).await???;
        }
        Ok(self.dir)
    }
}
