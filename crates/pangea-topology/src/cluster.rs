//! The cluster file: where a running deployment's replicas listen. `pangea cluster
//! up` writes it (`DIR/cluster.toml`); clients and operator commands take it as
//! `--cluster FILE`.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// The topology's name.
    pub name: String,
    /// The topology file with every replica's address filled in.
    pub topology: PathBuf,
    pub placement: Option<PathBuf>,
    /// The cluster certificates directory.
    pub certs: PathBuf,
    /// Whether replicas (and clients, which should do the same) delay traffic by the
    /// topology's latencies.
    #[serde(default)]
    pub emulate_wan: bool,
    /// Whether replicas accept runtime faults on their admin endpoint (drills:
    /// `pangea cluster nemesis`).
    #[serde(default)]
    pub fault_injection: bool,
    #[serde(default)]
    pub replicas: Vec<ClusterReplica>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterReplica {
    pub id: String,
    pub region: String,
    /// QUIC address.
    pub address: String,
    /// Admin HTTP address.
    pub admin: String,
    pub data_dir: PathBuf,
    /// Process id, for local clusters.
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub log: Option<PathBuf>,
}

impl ClusterFile {
    pub fn load(path: &Path) -> Result<ClusterFile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read cluster file {}: {e}", path.display()))?;
        toml_edit::de::from_str(&text).map_err(|e| format!("cluster file {}: {e}", path.display()))
    }

    pub fn save(&self, path: &Path) -> Result<(), String> {
        let text =
            toml_edit::ser::to_string_pretty(self).map_err(|e| format!("cluster file: {e}"))?;
        let tmp = path.with_extension("toml.tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    pub fn replica(&self, id: &str) -> Option<&ClusterReplica> {
        self.replicas.iter().find(|r| r.id == id)
    }
}
