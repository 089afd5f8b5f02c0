//! `pangea-ops`: operating Pangea on one machine, as a library the `pangea`
//! command, the tests and the drills share.
//!
//! - [`local`]: local clusters — every replica of a topology as a `pangea start`
//!   process on 127.0.0.1 (certificates, sockets handed over, cluster file, health
//!   waits, stop and restart);
//! - [`admin`]: a typed client of a replica's admin endpoint (`/health`,
//!   `/watermarks`, `/metrics`, `/fault`) over hyper, with the body types
//!   `pangea_node::admin` serves;
//! - [`nemesis`]: Jepsen-style fault injection into a running local cluster while
//!   checker workloads run, a recorded history, and the checkers run on it
//!   (docs/reliability.md).
//! - [`apply`]: topology and placement changes to a running local cluster,
//!   validated, diffed, applied, put back on refusal;
//! - [`bench`]: the benchmark harnesses (load against a cluster, the QUIC echo
//!   floor, Redis through the same clock);
//! - [`calibrate`]: the simulator against a live local cluster, one workload run
//!   on both (docs/drills.md, "Fidelity");
//! - [`demo`]: the main job — a local multi-region cluster on the embedded default
//!   topology, loaded with ad profiles and read in every mode.

pub mod admin;
pub mod apply;
pub mod backup;
pub mod bench;
pub mod calibrate;
pub mod demo;
pub mod local;
pub mod nemesis;
pub mod resize;
