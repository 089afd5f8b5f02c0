//! `pangea-sim`: Pangea's discrete-event simulator.
//!
//! Failover drills run many replicas over a model of the WAN in virtual time, much
//! faster than real time and exactly reproducibly: a run is a function of its
//! topology, its configuration, its seed and its sequence of inputs. Nothing here
//! reads a clock or draws OS randomness; every order that can show (event ties,
//! statistics, partitions) is fixed by sequence numbers, `BTreeMap`s or dense
//! indices, never by a `HashMap`'s iteration.
//!
//! This crate holds, so far, the network half; the driver that runs `pangea-core`
//! replicas over it comes later. The network is generic over the message type.
//!
//! Modules:
//! - [`time`]: [`SimTime`] and [`SimDuration`], virtual microseconds;
//! - [`queue`]: [`EventQueue`], a min-heap where equal times pop in insertion order;
//! - [`rng`]: [`SimRng`], the seeded PRNG every random draw comes from;
//! - [`net`]: [`Network`], the WAN between replicas: latency from the topology,
//!   jitter, bandwidth as serialization delay, loss as retransmission delay,
//!   per-connection FIFO, partitions, down replicas, link overrides, accounting;
//! - [`error`]: the one error type, [`NetError`].
//!
//! A driver loop looks like this:
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

pub mod charts;
pub mod drill;
pub mod error;
mod ids;
pub mod net;
pub mod queue;
pub mod rng;
pub mod runner;
pub mod scenario;
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
