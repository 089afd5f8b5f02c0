//! `pangea-sim`: Pangea's discrete-event simulator.
//!
//! Failover drills run many replicas over a model of the WAN in virtual time, much
//! faster than real time and exactly reproducibly: a run is a function of its
//! topology, its configuration, its seed and its sequence of inputs. Nothing here
//! reads a clock (beyond timing a run for its report) or draws OS randomness; every
//! order that can show (event ties, statistics, partitions) is fixed by sequence
//! numbers, `BTreeMap`s or dense indices, never by a `HashMap`'s iteration.
//!
//! The replicas are `pangea-core`'s own, driven as its `Replica` documentation
//! prescribes; frontends plan their reads with `pangea_core::read`, as the client
//! library does; a fault timeline runs beside them and checkers watch every step.
//! Wherever the topology allows, a run is split into two shards on up to two
//! threads, with the same result on one thread or two (docs/drills.md).
//!
//! Modules:
//! - [`time`]: [`SimTime`] and [`SimDuration`], virtual microseconds;
//! - [`queue`]: [`EventQueue`], a min-heap where equal times pop in insertion order;
//! - [`rng`]: [`SimRng`], the project's seeded generator adapted to `rand`;
//! - [`net`]: [`Network`], the WAN between replicas, generic over the message type:
//!   latency from the topology, jitter, bandwidth as serialization delay, loss as
//!   retransmission delay, per-connection FIFO, partitions, down replicas, link
//!   overrides, accounting;
//! - `detach`: deep copies of a deployment that share no `Arc` with the
//!   original, so each thread of a split run works on its own;
//! - `ids`: dense indices for replica, region and scope names (the interner);
//! - [`shared_rows`]: rows the in-memory stores of one run share (the core's
//!   `RowSharing` hook), so a 27-replica run holds most rows once;
//! - [`scenario`]: [`scenario::Scenario`], what one run runs (deployment, workload,
//!   fault timeline, expected outcomes) as validated data;
//! - [`workload`]: drawing client operations: arrivals, kinds, consistency modes,
//!   keys and values;
//! - [`sim`]: the driver, [`sim::Simulation`]: replicas over the network, the
//!   frontends ([`sim::client`]), operations, faults, the checkers C1–C7, metrics
//!   and the report ([`sim::metrics`]), and the split into two shards
//!   ([`sim::run_scenario`], [`sim::plan_split`]);
//! - [`drill`]: drill files (`sim/drills/*.toml`), parsed and resolved into a
//!   `Scenario`;
//! - [`runner`]: entry points of `pangea sim`: run a drill file, write its outputs,
//!   tell pass from fail;
//! - [`charts`]: a drill's report directory: `report.json`, `summary.md` and SVG
//!   charts;
//! - [`swarm`]: swarm testing: a random deployment, workload and fault rates per
//!   seed, checked by the same checkers;
//! - [`error`]: the crate's one error type, [`NetError`].
//!
//! The network on its own, driven by hand:
//!
//! ```
//! # use pangea_sim::{net::{NetConfig, Network}, SimTime};
//! # use pangea_topology::Topology;
//! # let text = include_str!("../../../topology/local-3-regions.toml");
//! # let topology = Topology::parse("local-3-regions.toml".as_ref(), text).unwrap();
//! let mut net: Network<&str> = Network::new(&topology, NetConfig::default(), 42).unwrap();
//! let _ = net.send(SimTime::ZERO, &"use1-a".into(), &"euw1-a".into(), "hello", 100);
//! while let Some(now) = net.next_delivery() {
//!     while let Some(d) = net.pop_delivery(now) {
//!         // hand d.msg to replica d.to at time `now`; it may send more
//!         assert_eq!(net.replica_id(d.to).unwrap().as_str(), "euw1-a");
//!     }
//! }
//! ```

pub mod capacity;
pub mod charts;
mod detach;
pub mod drill;
pub mod error;
pub mod host;
mod ids;
pub mod net;
pub mod queue;
pub mod rng;
pub mod runner;
pub mod scenario;
pub mod shared_rows;
pub mod sim;
pub mod swarm;
pub mod time;
pub mod workload;

pub use error::NetError;
pub use net::{
    Delivery, DropReason, Dropped, NetConfig, NetStats, Network, PathState, ReplicaIdx, SendOutcome,
};
pub use queue::EventQueue;
pub use rng::SimRng;
pub use time::{SimDuration, SimTime};
