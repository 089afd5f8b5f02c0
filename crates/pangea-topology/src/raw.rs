//! The operator files as written: plain serde structs with `deny_unknown_fields`.
//! Nothing here is validated; [`crate::Topology`] and [`crate::Placement`] are built
//! from these by `TryFrom`-style constructors that report every problem at once.

use serde::Deserialize;
use std::collections::BTreeMap;

/// `topology.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTopology {
    pub name: String,
    /// Round trip between two replicas of one region, unless the region overrides it.
    pub intra_region_rtt_ms: f64,
    /// Shard groups of the deployment (default 1): fixed once chosen.
    pub shard_groups: Option<i64>,
    #[serde(default)]
    pub continents: Vec<RawContinent>,
    #[serde(default)]
    pub links: Vec<RawLink>,
    #[serde(default)]
    pub app_profiles: Vec<RawAppProfile>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawContinent {
    pub name: String,
    #[serde(default)]
    pub regions: Vec<RawRegion>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRegion {
    pub name: String,
    pub intra_rtt_ms: Option<f64>,
    #[serde(default)]
    pub replicas: Vec<RawReplica>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReplica {
    pub id: String,
    pub role: String,
    pub zone: Option<String>,
    /// `host:port` the replica listens on for QUIC; local clusters fill it in.
    pub address: Option<String>,
    /// Rendezvous weight for row affinity (default 1.0).
    pub weight: Option<f64>,
    /// Prefer (`true`) or avoid (`false`) this replica as a replication hub;
    /// default by role (relays, then serving, then batch replicas).
    pub hub: Option<bool>,
    /// Processes the replica runs, each hosting a range of shard groups (default 1).
    pub processes: Option<i64>,
    /// While the replica is resized (`pangea cluster resize` writes these): the
    /// process count it had before, and the step the move is at (`"copy"` or
    /// `"serve"`).
    pub resize_from: Option<i64>,
    pub resize_phase: Option<String>,
    /// The replica is being removed (`topology apply` sets it first): it takes
    /// no more writes, and its stream reaches every peer before it goes.
    #[serde(default)]
    pub draining: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLink {
    pub a: String,
    pub b: String,
    pub rtt_ms: Option<f64>,
    #[serde(default)]
    pub cost_per_gb: f64,
    pub bandwidth_mbps: Option<f64>,
    #[serde(default)]
    pub loss: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAppProfile {
    pub name: String,
    pub routing: String,
    #[serde(default)]
    pub replicas: Vec<String>,
    #[serde(default = "default_priority")]
    pub priority: String,
    /// Where writes go by default: `"nearest"` (absent) or `"row-affinity"`.
    pub writes: Option<String>,
    /// Table name → `"read"` or `"read-write"`. Absent: no grant at all, which is
    /// refused (a profile that may touch nothing is a mistake).
    pub tables: Option<BTreeMap<String, String>>,
    /// Placement policies whose rows the profile may touch; absent: every policy.
    pub policies: Option<Vec<String>>,
}

fn default_priority() -> String {
    "serving".into()
}

/// `placement.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPlacement {
    #[serde(default)]
    pub tables: Vec<RawTable>,
    #[serde(default)]
    pub policies: Vec<RawPolicy>,
    #[serde(default)]
    pub rules: Vec<RawRule>,
    #[serde(default)]
    pub home_rules: Vec<RawHomeRule>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTable {
    pub name: String,
    #[serde(default = "default_policy")]
    pub default_policy: String,
    #[serde(default)]
    pub families: Vec<RawFamily>,
    /// Which prefix of the row key picks the shard group; absent: the whole key.
    pub partition_key: Option<RawPartitionKey>,
    /// Whether writes may carry an event time, and how far from the clock.
    pub event_time: Option<RawEventTime>,
    /// Change streams: how long the replication log keeps the table's changes.
    pub changes: Option<RawChanges>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawChanges {
    /// A duration: how long a change stays readable (`"24h"`).
    pub retention: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEventTime {
    /// A duration: how far back an event time may be (`"90d"`).
    pub past: String,
    /// A duration: how far ahead (default `"1m"`, at most `"1h"`).
    pub future: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPartitionKey {
    /// One ASCII character.
    pub separator: String,
    pub fields: i64,
}

fn default_policy() -> String {
    crate::GLOBAL_POLICY.into()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFamily {
    pub name: String,
    pub max_versions: Option<i64>,
    /// A duration such as `"90s"`, `"30m"`, `"12h"`, `"30d"`.
    pub ttl: Option<String>,
    /// `"cells"` (the default) or `"counter"`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    pub name: String,
    pub regions: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    pub table: String,
    pub prefix: String,
    pub policy: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHomeRule {
    pub table: String,
    pub prefix: String,
    pub home: String,
}
