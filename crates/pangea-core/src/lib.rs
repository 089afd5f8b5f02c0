//! `pangea-core`: the sans-IO heart of Pangea.
//!
//! Nothing here performs I/O, reads a clock or draws unseeded randomness: time comes
//! in as parameters and storage goes through the [`storage::Storage`] trait, so the
//! QUIC replica (`pangea-node`) and the simulator (`pangea-sim`) drive the very same
//! code. A `clippy.toml` next to this crate's manifest forbids `Instant::now`,
//! `SystemTime::now`, `thread_rng` and `tokio::spawn`; CI checks that the crate's
//! normal dependencies include no tokio, quinn, rustls or fjall.
//!
//! Modules:
//! - [`auth`]: who may do what (principals, actions, the authorization matrix);
//! - [`ids`]: replica and scope identifiers;
//! - [`limits`]: named size limits on user data;
//! - [`hlc`]: the hybrid logical clock and its [`hlc::Timestamp`];
//! - [`mutation`]: validated row mutations;
//! - [`row`]: replicated row state and the merge rule (last writer wins per cell,
//!   tombstones, deterministic GC);
//! - [`digest`]: content digests for comparing replicas;
//! - [`token`]: consistency tokens;
//! - [`storage`]: the storage trait and the types it takes; `MemStorage` (its `mem`
//!   module) in memory for tests and the simulator, with a crash model and a hook
//!   for rows shared between the stores of one run (`RowSharing`);
//! - [`watermark`]: a replica's watermarks for one scope;
//! - [`frame`]: replication frames, parsed and bounded;
//! - [`link`]: a replication stream's codec (heartbeats condensed per stream);
//! - [`replica`]: the replica state machine (streams, forwarding, gap repair,
//!   heartbeats, snapshots, suspicion);
//! - [`read`]: read decisions (the replica's `decide`) and read routing (`route`,
//!   the client's plans), shared by client and simulator;
//! - [`frontend`]: what a frontend remembers between requests (round trips, failed
//!   replicas, hedging delay and budget) and its constants, shared likewise, and
//!   [`frontend::call`]: one read's or write's decisions as a sans-IO state machine
//!   (`ReadCall`, `WriteCall`) that `pangea-client` and the simulator both drive;
//! - [`location`]: location metadata (the `_location` table: per-prefix policy,
//!   home and migration state) and the residency rule for moves;
//! - [`migration`]: a placement migration job (dual write, backfill, flip) as a
//!   state machine the runner's driver steps with its replica;
//! - [`readiness`]: the gate that keeps a restarted or new replica from serving
//!   reads until it has caught up with its peers, driven by node and simulator;
//! - [`redact`]: how user keys appear in logs, traces and error messages (hashed);
//! - [`rng`]: the project's one seeded generator (splitmix64), used here, by the
//!   WAN emulator and backoff of `pangea-net`, and by the simulator;
//! - `idmap`: a small map keyed by replica id that finds a held id by its address
//!   (the replica's streams, peers and peer clocks);
//! - `error`: the crate's one error type, with storage errors keeping their
//!   engine's source.
//!
//! Invariants cited as `I<n>` are numbered in `docs/invariants.md`.

pub mod auth;
pub mod changes;
pub mod digest;
mod error;
pub mod filter;
pub mod frame;
pub mod frontend;
pub mod hash;
pub mod hlc;
mod idmap;
pub use pangea_topology::ids;
pub mod limits;
pub mod link;
pub mod location;
pub mod migration;
pub mod mutation;
pub mod read;
pub mod readiness;
pub mod redact;
pub mod replica;
pub mod rng;
pub mod row;
pub mod storage;
pub mod token;
pub mod watermark;

pub use error::{Chain, EngineError, Error, StorageError};
pub use filter::{BytesRange, CellFilter};
pub use hlc::{HybridClock, Timestamp};
pub use ids::{ReplicaId, ScopeId};
pub use limits::Limits;
pub use mutation::{Mutation, RowMutation, TimeRange};
pub use row::{ReadFilter, RowState, Version};
pub use storage::{
    Compaction, LogEntry, MemStorage, RowApply, RowWrite, Storage, Watermark, WriteBatch,
};
pub use token::Token;
pub use watermark::ScopeWatermarks;
