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
//!
//! Not here yet (still in `pangea-cli`, issue 33): the simulator calibration and
//! the bench harnesses.

pub mod admin;
pub mod local;
pub mod nemesis;
