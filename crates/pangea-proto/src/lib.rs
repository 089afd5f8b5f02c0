//! Pangea's wire schema, generated at build time from `proto/pangea/v1/*.proto`.
//!
//! - `data.proto`: cells, mutations, rows and the replicated row state;
//! - `client.proto`: requests and responses between `pangea-client` and a replica;
//! - `replication.proto`: frames between replicas;
//! - `ad_profile.proto`: the example `AdProfile` an ad frontend stores.
//!
//! Decoding untrusted bytes: callers check a frame's length against their limit
//! before handing it to `prost::Message::decode`, which itself never panics.

#![allow(unreachable_pub, missing_debug_implementations, clippy::all)]

/// Version 1 of the schema.
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/pangea.v1.rs"));
}

pub use prost::{self, Message};

/// The replication protocol version carried in `Hello`.
pub const PROTOCOL_VERSION: u32 = 1;
